"""The proposer contract: what a drafter is asked, and when."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

    from lanes.chain_graphs import ChainGraphs
    from lanes.device_sampling import DeviceChain
    from lanes.lane_rows import LaneRows
    from lanes.lane_view import Chunk, LaneView

# A drafter's forward rows of one lane: (its shadow of the lane, the rows as plain data). A
# shadow (the drafter's own blocks and progress) names its lane view as `.lane`.
ShadowRows = tuple["Shadow", "LaneRows"]


@dataclass(frozen=True)
class Draft:
    """Draft tokens, on the host (`token_ids`) or still on the device: rows `rows` of `source`
    (a drafter that chains its steps there). The engine feeds device drafts to the verify
    forward device to device and reads them back with the target's samples, in one copy."""

    token_ids: tuple[int, ...] = ()
    # The drafter's sampling distribution at each drafted position [len, vocab] (log space), for
    # rejection-mode verification; None when the drafter proposes deterministically.
    logprobs: torch.Tensor | None = None
    rows: tuple[int, ...] = ()
    source: torch.Tensor | None = field(default=None, compare=False, repr=False)
    # a draft tree's other root-to-leaf paths, host ids (lanes.rounds.Step.branches)
    branches: tuple[tuple[int, ...], ...] = ()

    @property
    def num_tokens(self) -> int:
        return len(self.rows) if self.source is not None else len(self.token_ids)

    def host_ids(self) -> tuple[int, ...]:
        """The draft tokens on the host (a device read for device drafts)."""
        if self.source is None:
            return self.token_ids
        values = self.source.tolist()
        return tuple(int(values[r]) for r in self.rows)


def collect_drafts(
    request_ids: Sequence[int],
    host: dict[int, list[int]],
    logprobs: dict[int, list[torch.Tensor]],
    chain: DeviceChain | None,
) -> list[Draft]:
    """The drafts of a drafter's k steps, by request: from the device chain when its steps
    chained there (left on the device), else the tokens and logprobs sampled on the host."""
    if chain is not None:
        on_device = chain.drafts()
        return [
            Draft(rows=on_device[r][1], source=on_device[r][0]) if r in on_device else Draft()
            for r in request_ids
        ]
    import torch

    return [
        Draft(tuple(host[r]), torch.stack(logprobs[r]) if logprobs[r] else None)
        for r in request_ids
    ]


class Shadow(Protocol):
    """A drafter's view of a lane: the lane's (read-only) view, and the drafter's own progress."""

    lane: LaneView
    num_computed: int


def run_chained(
    graphs: ChainGraphs | None,
    steps: Sequence[ShadowRows],
    wanted: dict[int, int],
    done: int,
    chain: DeviceChain,
    previous: torch.Tensor | None = None,
) -> bool:
    """Run steps (rows of shadows of lanes) and the drafter's forwards after them as one graph
    replay (lanes.chain_graphs), adding the samples to `chain`: each lane's wanted[request]
    drafts less the `done` ones already made. False, with nothing run, where the graphs do not
    take these steps."""
    counts = [wanted[shadow.lane.request_id] - done for shadow, _ in steps]
    rows = [r for _, r in steps]
    if graphs is None or not steps or not graphs.supports(rows, counts):
        return False
    keys = [shadow.lane.request_id for shadow, _ in steps]
    chain.extend(graphs.run(rows, counts, previous), keys, counts)
    return True


class Proposer:
    """Proposes draft tokens for decode lanes. The engine calls, in each round:

    Lanes come as read-only views (lanes/lane_view.py), never the engine's lanes or steps.

    - `prefill(chunks)` after every forward, with that forward's prompt chunks of drafting lanes:
      a drafter with its own KV computes the same chunks, inside the same round (its time
      counts in the round's measured time, hence in the share allocator's cost model);
    - `propose(lanes, num_drafts, num_branches)` once before the round's forwards: up to
      num_drafts[i] tokens continuing lane i's known tokens (fewer, or none, is always allowed),
      on the host or left on the device (`Draft.source`), so the host need not wait for the
      drafter's forwards; a proposer that can draft trees may add up to num_branches[i] - 1
      other paths from the same root (`Draft.branches`, host ids, each at most num_drafts[i]
      long); the others ignore num_branches;
    - `accepted(lane)` after the lane's drafts were verified: `lane.num_computed` says how much
      of the lane is now settled; state past it must be rolled back;
    - `release(lane)` when the lane ends or is preempted: drop everything kept for it;
    - `observe(lane, start, hidden)`, only for proposers with `uses_target_hidden`, after every
      target forward over a drafting lane and before `prefill`/`accepted`: the target's
      final-norm features of positions [start, start + len(hidden)), now settled (a view the next
      forward overwrites: copy what you keep); with `target_feature_layers`, the normed outputs
      of those target layers side by side instead (lanes.models.decoder), or with
      `target_features_prenorm` their residual stream before the norm (EAGLE-3 heads).

    A proposer only affects speed: with coupled verification the output never depends on it.
    """

    name = "proposer"
    uses_target_hidden = False
    target_feature_layers: tuple[int, ...] | None = None
    target_features_prenorm = False

    def prefill(self, chunks: Sequence[Chunk]) -> None:
        return None

    def propose(
        self,
        lanes: Sequence[LaneView],
        num_drafts: Sequence[int],
        num_branches: Sequence[int] | None = None,
    ) -> list[Draft]:
        raise NotImplementedError

    def accepted(self, lane: LaneView) -> None:
        return None

    def release(self, lane: LaneView) -> None:
        return None

    def observe(self, lane: LaneView, start: int, hidden: torch.Tensor) -> None:
        """The target's features of the lane's rows from `start`: the caller's copy (not a
        buffer the next forward reuses), which the drafter may keep as it is."""
        return None

    def cached_prefix_blocks(self, lane: LaneView, num_blocks: int) -> int:
        """Of the lane's first `num_blocks` blocks (the target's prompt-cache hit), how many
        leading ones this proposer holds rows for without the target's features (all, by
        default: only drafters that read features need the target to compute a block)."""
        return num_blocks

    def device_rounds(self, target, num_drafts: int, eager: bool = False, branches: int = 1):
        """A lanes.device_rounds.DeviceRounds drafting with this proposer on the target's
        runner, where it can draft on the device alone; None (the default): rounds stay
        host-managed."""
        return None
