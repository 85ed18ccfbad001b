"""The engine: admits requests into lanes, runs lane rounds, samples, and finishes lanes."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from cache.block_pool import BlockPool
from cache.block_table import BlockTable
from cache.kv_pool import KVPool
from lanes.config import EngineConfig
from lanes.detokenize import IncrementalDetokenizer
from lanes.lane import Lane, LaneState
from lanes.models import Checkpoint, build_decoder, open_checkpoint
from lanes.ops import make_ops
from lanes.rounds import LaneRound, Step, plan_round
from lanes.runner import ModelRunner
from lanes.sampling import SamplingParams

# A prompt is text, token ids, or chat messages ([{"role": ..., "content": ...}, ...]).
Prompt = str | list[int] | list[dict]


class RequestError(ValueError):
    """A request lanes cannot serve (too long, empty, bad ids): the engine keeps running."""


@dataclass(frozen=True)
class Completion:
    request_id: int
    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str
    logprobs: list[float]  # log-probability of each chosen token under the sampled distribution


class Engine:
    def __init__(
        self,
        model: str | None = None,
        config: EngineConfig | None = None,
        *,
        checkpoint: Checkpoint | None = None,
    ) -> None:
        self.config = config or EngineConfig()
        ckpt = checkpoint or open_checkpoint(model)
        self.model_config = ckpt.config
        self.tokenizer = ckpt.tokenizer
        self.fingerprint = ckpt.fingerprint
        self.source = ckpt.source
        self.dtype = getattr(torch, self.config.torch_dtype_name)
        self.ops = make_ops(self.config.exact)
        decoder = build_decoder(ckpt, self.ops, self.dtype, self.config.device)
        mc, bs = self.model_config, self.config.block_size
        per_block = KVPool.bytes_per_block(
            mc.num_layers, bs, mc.num_kv_heads, mc.head_dim, self.dtype
        )
        num_blocks = max(1, self.config.kv_cache_bytes // per_block)
        self.pool = BlockPool(num_blocks)
        kv = KVPool(
            mc.num_layers,
            num_blocks,
            bs,
            mc.num_kv_heads,
            mc.head_dim,
            self.dtype,
            self.config.device,
        )
        self.runner = ModelRunner(decoder, kv, self.config.device)
        self.eos_token_ids = frozenset(self.tokenizer.eos_token_ids) | frozenset(mc.eos_token_ids)
        self.waiting: list[Lane] = []
        self.running: list[Lane] = []
        self._ids = itertools.count()

    @property
    def context_len(self) -> int:
        return self.model_config.max_position_embeddings

    def encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt)
        if prompt and all(isinstance(m, dict) for m in prompt):
            return self.tokenizer.encode_chat(prompt)
        if all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise RequestError("a prompt is a string, a list of token ids, or a list of messages")

    def add_request(self, prompt: Prompt, params: SamplingParams) -> int:
        lane = self._new_lane(prompt, params)
        self.waiting.append(lane)
        return lane.request_id

    def _new_lane(self, prompt: Prompt, params: SamplingParams) -> Lane:
        """Validate a request and make its lane (not yet queued)."""
        ids = self.encode(prompt)
        vocab = self.model_config.vocab_size
        if not ids:
            raise RequestError("the prompt is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise RequestError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) >= self.context_len:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the model's context is {self.context_len} "
                "tokens and at least one must be left to generate"
            )
        table = BlockTable(self.config.block_size)
        if table.blocks_needed(len(ids) + 1) > self.pool.num_blocks:
            raise RequestError(
                f"the prompt has {len(ids)} tokens; the KV cache holds "
                f"{self.pool.num_blocks * self.config.block_size} (raise kv_cache_bytes)"
            )
        return Lane(
            request_id=next(self._ids),
            prompt_ids=ids,
            params=params.with_seed(),
            block_table=table,
            detokenizer=IncrementalDetokenizer(self.tokenizer, ids),
        )

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _max_len(self, lane: Lane) -> int:
        """Last length the lane can reach: prompt + max_tokens, within context and KV pool."""
        cap = min(self.context_len, self.pool.num_blocks * self.config.block_size)
        return min(len(lane.prompt_ids) + lane.params.max_tokens, cap)

    def _admit(self) -> None:
        """Admit waiting lanes in order while lanes and whole-lifetime KV blocks are free."""
        while self.waiting and len(self.running) < self.config.max_lanes:
            lane = self.waiting[0]
            need = lane.block_table.blocks_needed(self._max_len(lane))
            if need > self.pool.num_free:
                break
            lane.block_table.append(self.pool.allocate(need))
            lane.state = LaneState.FILL
            self.running.append(self.waiting.pop(0))

    def step(self) -> list[Completion]:
        """Run one lane round; return the requests that finished in it."""
        self._admit()
        plan = plan_round(self.running, self.config.max_tokens_per_round)
        if not plan.steps:
            return []
        logits = self.runner.execute(plan)  # [num_sampling_steps, vocab]
        sampling = [s for s in plan.steps if s.samples]
        rows = [(s.lane.params, s.lane.num_known, s.lane.params.seed) for s in sampling]
        picks = self.ops.sample(logits, rows)
        for step in plan.steps:
            step.lane.num_computed = step.end
        finished = []
        for step, (token, logprobs) in zip(sampling, picks, strict=True):
            lane = step.lane
            lane.state = LaneState.DECODE
            self._append(lane, token, float(logprobs[token]))
            if lane.finish_reason is not None:
                finished.append(self._finish(lane))
        return finished

    def _append(self, lane: Lane, token: int, logprob: float) -> None:
        p = lane.params
        lane.output_ids.append(token)
        lane.output_logprobs.append(logprob)
        lane.text += lane.detokenizer.push(token)
        if (
            (token in self.eos_token_ids and not p.ignore_eos)
            or token in p.stop_token_ids
            or p.stop
            and self._cut_at_stop(lane)
        ):
            lane.finish_reason = "stop"
        elif lane.num_known >= self._max_len(lane):
            lane.finish_reason = "length"

    @staticmethod
    def _cut_at_stop(lane: Lane) -> bool:
        hits = [i for i in (lane.text.find(s) for s in lane.params.stop) if i >= 0]
        if hits:
            lane.text = lane.text[: min(hits)]
        return bool(hits)

    def _finish(self, lane: Lane) -> Completion:
        if lane.finish_reason == "length":
            lane.text += lane.detokenizer.flush()
        lane.state = LaneState.DONE
        self.running.remove(lane)
        self.pool.release(lane.block_table.clear())
        return Completion(
            request_id=lane.request_id,
            prompt_ids=lane.prompt_ids,
            token_ids=list(lane.output_ids),
            text=lane.text,
            finish_reason=lane.finish_reason or "stop",
            logprobs=list(lane.output_logprobs),
        )

    def prompt_logits(self, prompts: list[Prompt]) -> list[torch.Tensor]:
        """Next-token logits [len(prompt), vocab] at every position of every prompt, all prompts in
        one forward (for scoring, prompt logprobs, and the batch-invariance tests)."""
        lanes = [self._new_lane(p, SamplingParams(max_tokens=1)) for p in prompts]
        need = sum(lane.block_table.blocks_needed(len(lane.prompt_ids)) for lane in lanes)
        if need > self.pool.num_free:
            raise RequestError(f"scoring needs {need} KV blocks, {self.pool.num_free} are free")
        for lane in lanes:
            lane.block_table.append(
                self.pool.allocate(lane.block_table.blocks_needed(lane.num_known))
            )
        try:
            plan = LaneRound(tuple(Step(lane, 0, lane.num_known) for lane in lanes))
            logits = self.runner.execute(plan, all_logits=True)
        finally:
            for lane in lanes:
                self.pool.release(lane.block_table.clear())
        return list(logits.split([lane.num_known for lane in lanes]))

    def generate(
        self, prompts: list[Prompt], params: SamplingParams | list[SamplingParams]
    ) -> list[Completion]:
        """Run every prompt to completion, all in the same lane rounds; results in input order."""
        per = params if isinstance(params, list) else [params] * len(prompts)
        if len(per) != len(prompts):
            raise RequestError("one SamplingParams per prompt, or one for all")
        lanes = [
            self._new_lane(p, sp) for p, sp in zip(prompts, per, strict=True)
        ]  # all valid, or none queued
        self.waiting.extend(lanes)
        ids = [lane.request_id for lane in lanes]
        done: dict[int, Completion] = {}
        while len(done) < len(ids):
            for c in self.step():
                done[c.request_id] = c
        return [done[i] for i in ids]
