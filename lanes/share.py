"""The wall-time share allocator: how many prompt tokens each round gets.

A cost model of round wall time, fitted online from measured rounds,

    seconds = overhead + per_prefill * P + per_decode * D

(P prefill tokens, D decode/verify tokens), lets the allocator pick P so that prompt work takes
`share` of the round's wall time when both kinds of work wait:

    per_prefill * P = share * (overhead + per_prefill * P + per_decode * D)
    P = share * (overhead + per_decode * D) / (per_prefill * (1 - share))

With only prompts waiting a round takes the whole token budget; with only decode, none. Decode
lanes advance every round. Prompt work comes in whole blocks (`min_prefill` tokens): where the
share asks for less than a block per round — prompt tokens dear beside few decode rows, as on
the CPU — the rounds owe it, and a round takes a block once the owed tokens reach one (rounds
between take none; they count in the achieved share), so the share holds there too. A waiting
prompt gets a block at least every MAX_SKIP rounds, so neither kind starves.

The budget is dithered by up to ±DITHER around its target: without it P would be a fixed function
of D, and the fit could not tell the per-prefill cost from the per-decode cost and overhead.
"""

from __future__ import annotations

import random
from collections import deque

import numpy as np

# Before any measurement: 2 ms per round, 20 µs per prompt token, 200 µs per decode token.
_PRIOR = np.array([2e-3, 2e-5, 2e-4])
_PRIOR_WEIGHT = 1e-2  # ridge pull towards the prior, so the fit is always defined
_MIN_ROUNDS = 8  # fewer measured rounds than this: keep the prior (one point fits anything)
_SHARE_WINDOW = 100  # the reported share covers this many recent mixed rounds
DITHER = 0.3
MAX_SKIP = 8  # rounds at most between a waiting prompt's blocks while lanes decode
SLOW_ROUND = 3.0  # a round this many times slower than the fit says is left out of it


class CostModel:
    """Least squares over the last `window` rounds, with a light ridge towards a prior."""

    def __init__(self, window: int = 256) -> None:
        self._rows: deque[tuple[float, float, float, float]] = deque(maxlen=window)
        self._params = _PRIOR.copy()
        self._stale = False  # rows arrived since the last fit

    def observe(self, prefill_tokens: int, decode_tokens: int, seconds: float) -> None:
        self._rows.append((1.0, float(prefill_tokens), float(decode_tokens), seconds))
        self._stale = len(self._rows) >= _MIN_ROUNDS

    @property
    def params(self) -> np.ndarray:
        """(overhead, per prefill token, per decode token), fitted when read: a fit costs
        ~0.3 ms of host time, and rounds of decode alone never read it."""
        if self._stale:
            self._fit()
        return self._params

    def _fit(self) -> None:
        self._stale = False
        data = np.array(self._rows)
        x, y = data[:, :3], data[:, 3]
        params = self._solve(x, y)
        # Rounds far slower than the fit (a graph captured or a kernel compiled inside them:
        # one-off seconds no later round repeats) are left out, once: on an H100 a first 1,024-
        # token prompt round of several seconds made the overhead so large that a 32K prompt
        # among 63 decoders took 8,128 tokens a round at share 0.5.
        typical = y <= SLOW_ROUND * (x @ params)
        if not typical.all() and typical.sum() >= _MIN_ROUNDS:
            params = self._solve(x[typical], y[typical])
        self._params = params

    @classmethod
    def _solve(cls, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        """Least squares of the relative error (each round weighted by 1 / its seconds, so a
        round of 8 ms counts as much as one of 0.5 s), with the ridge towards the prior."""
        weight = 1.0 / np.maximum(y, 1e-6)
        x, y = x * weight[:, None], y * weight
        floor = _PRIOR * 1e-3  # costs are positive
        # Costs that come out below the floor are held there and the others refitted without
        # them (clamping after the solve left the rest fitted to a negative one: on the CPU a
        # slow first prompt round made the overhead negative, and decode rounds were then
        # predicted at 4x their time).
        held = np.zeros(3, dtype=bool)
        for _ in range(3):
            free = ~held
            fitted = floor.copy()
            fitted[free] = cls._ridge(x[:, free], y - x[:, held] @ floor[held], _PRIOR[free])
            if (fitted >= floor).all():
                break
            held |= fitted < floor
        return np.maximum(fitted, floor)

    @staticmethod
    def _ridge(x: np.ndarray, y: np.ndarray, prior: np.ndarray) -> np.ndarray:
        # Scale columns so the ridge treats them alike, then solve the normal equations.
        scale = np.maximum(np.abs(x).max(axis=0), 1.0)
        xs = x / scale
        lam = _PRIOR_WEIGHT * np.eye(x.shape[1])
        rhs = xs.T @ y + lam @ (prior * scale)
        return np.linalg.solve(xs.T @ xs + lam, rhs) / scale

    def predict(self, prefill_tokens: int, decode_tokens: int) -> float:
        a, b, c = self.params
        return float(a + b * prefill_tokens + c * decode_tokens)


class ShareAllocator:
    def __init__(self, share: float, min_prefill: int, max_tokens: int) -> None:
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"prefill share must be in [0, 1], got {share}")
        self.share = share
        self.min_prefill = min_prefill
        self.max_tokens = max_tokens
        self.model = CostModel()
        # (seconds attributed to prompt work, wall seconds) of recent rounds with both kinds
        self._mixed: deque[tuple[float, float]] = deque(maxlen=_SHARE_WINDOW)
        self.last_share: float | None = None
        self._dither = random.Random(0)  # own generator: planning never touches global RNG state
        self._owed = 0.0  # prompt tokens the share asked for and rounds below a block skipped
        self._skipped = 0  # rounds planned without prompt work that owe it: not yet recorded

    def set_share(self, share: float) -> float:
        """A new target share for the rounds planned from now on (the console's control); the
        previous one. Which round a prompt chunk lands in changes, never a token: every row's
        bits are the same whatever else shares its forward."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"prefill share must be in [0, 1], got {share}")
        previous, self.share = self.share, share
        return previous

    def prefill_budget(
        self, decode_tokens: int, prompts_waiting: bool, whole_round: bool = False
    ) -> int:
        """Prompt tokens for the next round. whole_round: prompt work takes all the room the
        decode rows leave, whatever the share (a burst, lanes/prompt_burst.py)."""
        room = self.max_tokens - decode_tokens
        if not prompts_waiting or room <= 0:
            self._owed = 0.0
            return 0
        if decode_tokens == 0 or self.share >= 1.0 or whole_round:
            self._owed = 0.0
            return room
        a, b, c = self.model.params
        want = self.share * (a + c * decode_tokens) / (b * (1.0 - self.share))
        u = self._dither.uniform(-DITHER, DITHER)
        want *= 1.0 + u
        if want >= self.min_prefill:
            self._owed = 0.0
            return int(min(room, want))
        # less than a block: owe it, and take a block once a block is owed
        self._owed += max(want, self.min_prefill / MAX_SKIP)
        if self._owed < self.min_prefill:
            # bounded: a skipped round whose record never comes (its lanes ended) must not
            # count later decode rounds against the share for long
            self._skipped = min(self._skipped + 1, MAX_SKIP)
            return 0
        self._owed -= self.min_prefill
        # the block varies too, or P would be constant there and the fit could not tell costs apart
        return int(min(room, self.min_prefill * (1.0 + abs(u))))

    def record(self, prefill_tokens: int, decode_tokens: int, seconds: float) -> None:
        """Feed one measured round back into the model and the achieved-share account."""
        self.model.observe(prefill_tokens, decode_tokens, seconds)
        if prefill_tokens and decode_tokens and seconds > 0:
            # The measured time, split between the kinds of work as the fitted costs weigh them.
            prefill_part = self.model.params[1] * prefill_tokens
            prefill_seconds = (
                seconds * prefill_part / self.model.predict(prefill_tokens, decode_tokens)
            )
            self._mixed.append((prefill_seconds, seconds))
            self.last_share = prefill_seconds / seconds
        else:
            self.last_share = 1.0 if prefill_tokens else 0.0
            if self._skipped and decode_tokens and not prefill_tokens:
                self._skipped -= 1  # a round that owed prompt work: part of the share's account
                self._mixed.append((0.0, seconds))

    @property
    def achieved_share(self) -> float | None:
        """Prompt work's share of wall time over recent rounds where both kinds of work ran or
        prompts waited (rounds that skipped prompt work to pay for a block count as 0)."""
        if not self._mixed:
            return None
        return sum(p for p, _ in self._mixed) / sum(t for _, t in self._mixed)
