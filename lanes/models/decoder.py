"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3, Qwen3-MoE, GLM-4 MoE, the
Qwen3.5 hybrids, and Nemotron-H, whose single-mixer blocks are layers with one half) over a flat
paged batch."""

from __future__ import annotations

import torch

from lanes.batch import ForwardBatch
from lanes.cache.kv_pool import KVPool
from lanes.cache.state_pool import StatePool
from lanes.config import ModelConfig
from lanes.models.deltanet import gated_deltanet, settle_deltanet
from lanes.models.mamba2 import mamba2_layer, settle_mamba2
from lanes.models.moe import moe_mlp
from lanes.models.rope import rope_tables
from lanes.models.weights import DecoderWeights
from lanes.ops import Ops


class Decoder:
    """Runs one forward: embeds the batch's tokens, writes their K/V into the pool, attends over
    each lane's whole context, and returns logits for the rows in `batch.logits_indices`.

    `last_hidden` [num_tokens, hidden] keeps the final-norm output of every row of the latest
    forward (what the LM head reads): the features an EAGLE-style drafter consumes. With
    `feature_layers` set (layer indices, the last one last), it is instead the normed residual
    stream after each of those layers, side by side [num_tokens, len * hidden]: low, middle and
    final layers together tell a drafter what the token is as well as what comes next. With
    `feature_prenorm`, the residual stream itself (what EAGLE-3 heads read).
    """

    def __init__(
        self, cfg: ModelConfig, weights: DecoderWeights, ops: Ops, comm=None, vocab_start: int = 0
    ) -> None:
        """With tensor parallelism, cfg and weights are this rank's shard and `comm` sums the
        row-parallel outputs and gathers the vocab-parallel logits (lanes.parallel)."""
        self.cfg = cfg
        self.weights = weights
        self.ops = ops
        self.comm = comm
        self.vocab_start = vocab_start
        self.cos, self.sin = rope_tables(cfg, weights.embed.device)
        self.last_hidden: torch.Tensor | None = None
        self.feature_layers: tuple[int, ...] | None = None
        self.feature_prenorm = False  # keep those layers' residual stream before the norm
        # the KV pool holds attention layers only (hybrids): layer index -> pool layer
        self.kv_layer = {layer: i for i, layer in enumerate(cfg.attention_layers)}
        self.state_layer = {layer: i for i, layer in enumerate(cfg.linear_layers)}

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        cfg, ops, w = self.cfg, self.ops, self.weights
        batch = ops.prepare(batch)
        eps = cfg.rms_norm_eps
        cos, sin = self.cos[batch.positions], self.sin[batch.positions]  # [n, rope_dim / 2]
        residual = self._embed(batch.input_ids)  # [n, hidden]
        if w.hidden_norm is not None:  # EAGLE-3 head: [normed embedding, normed feature]
            feature = batch.features.to(residual.dtype)
            normed = ops.rms_norm(feature, w.hidden_norm, eps)
            x = torch.cat([ops.rms_norm(residual, w.layers[0].input_norm, eps), normed], -1)
            residual = normed if w.norm_before_residual else feature
        else:
            if w.fuse is not None:  # EAGLE-style drafter: token embedding + the target's feature
                residual = ops.linear(
                    torch.cat([residual, batch.features.to(residual.dtype)], -1), w.fuse
                )
            x = ops.rms_norm(residual, w.layers[0].input_norm, eps)
        kept = []  # feature_layers' outputs
        for i, layer in enumerate(w.layers):
            next_norm = w.layers[i + 1].input_norm if i + 1 < len(w.layers) else w.norm
            if layer.has_mixer:  # every layer but Nemotron-H's MLP blocks
                o = self._mix(x, layer, i, kv, batch, cos, sin)
                after = layer.post_norm if layer.has_mlp else next_norm
                residual, x = ops.add_rms_norm(o, residual, after, eps)
            if layer.has_mlp:  # every layer but Nemotron-H's mixer blocks
                residual, x = ops.add_rms_norm(self._mlp(x, layer), residual, next_norm, eps)
            if self.feature_layers is not None and i in self.feature_layers:
                kept.append(residual if self.feature_prenorm else x)
        # an EAGLE-3 head feeds its pre-norm output back as the next row's feature
        self.last_hidden = (
            torch.cat(kept, dim=-1) if kept else residual if w.hidden_norm is not None else x
        )
        logits = ops.linear(x[batch.logits_indices], w.lm_head).float()  # [num_logits, vocab]
        return logits if self.comm is None else self.comm.gather_last(logits)

    def _mix(self, x, layer, i: int, kv: KVPool, batch, cos, sin) -> torch.Tensor:
        """The layer's token mixer: attention over the paged KV, or a recurrent one (hybrids:
        a gated DeltaNet or a Mamba-2 mixer, no KV)."""
        if layer.deltanet is not None:
            j = self.state_layer[i]
            return gated_deltanet(self.ops, x, layer.deltanet, self.cfg, batch, kv.states, j)
        if layer.mamba is not None:
            j = self.state_layer[i]
            return mamba2_layer(self.ops, x, layer.mamba, self.cfg.mamba, batch, kv.states, j)
        return self._reduce(self._attention(x, layer, kv, self.kv_layer[i], batch, cos, sin))

    def _mlp(self, x, layer) -> torch.Tensor:
        ops = self.ops
        if layer.router is not None:
            return self._reduce(moe_mlp(ops, x, layer, self.cfg))
        if layer.up is not None:  # Nemotron-H: relu(up x)², no gate
            return self._reduce(
                ops.linear(torch.relu(ops.linear(x, layer.up)).square(), layer.down)
            )
        return self._reduce(ops.glu_linear(ops.linear(x, layer.gate_up), layer.down))

    def settle_states(self, states: StatePool, slot: int, num_computed: int) -> None:
        """Hybrids, after a verify step: the lane's slot advanced over the accepted rows, to the
        state after position num_computed - 1 (cache/state_pool.py)."""
        entry = states.pending.pop(slot, None)
        if entry is None:
            return
        first, inputs = entry
        num_rows = num_computed - first
        if len(inputs) != len(self.state_layer):
            raise AssertionError(
                f"state slot {slot}: the verify step deferred {len(inputs)} layers"
            )
        for i, layer in enumerate(self.weights.layers):
            j = self.state_layer.get(i)
            if j is None:
                continue
            rows = inputs[j]  # the verify rows' inputs to the recurrence
            if not 0 < num_rows <= rows[0].shape[0]:
                raise AssertionError(
                    f"state slot {slot}: position {num_computed - 1} is not among the verify rows"
                )
            if layer.mamba is not None:
                m = layer.mamba
                settle_mamba2(self.ops, m, self.cfg.mamba, states, slot, j, first, rows, num_rows)
            else:
                settle_deltanet(
                    self.ops, layer.deltanet, self.cfg, states, slot, j, first, rows, num_rows
                )

    def _attention(self, x, layer, kv: KVPool, pool_layer: int, batch, cos, sin) -> torch.Tensor:
        """Causal attention over the paged KV, o_proj applied: [n, hidden] (a partial sum under
        tensor parallelism). Qwen3.5: RoPE on the first rope_dim dims of each head only, and the
        output gated by sigmoid of a fourth projection."""
        cfg, ops, eps = self.cfg, self.ops, self.cfg.rms_norm_eps
        n, d = x.shape[0], cfg.head_dim
        qkv = ops.linear(x, layer.qkv, layer.qkv_bias)  # [n, q_size + 2 * kv_size (+ q_size)]
        sizes = [cfg.q_size, cfg.kv_size, cfg.kv_size] + [cfg.q_size] * cfg.attn_output_gate
        q, k, v, *gate = qkv.split(sizes, dim=-1)
        q = q.reshape(n, cfg.num_heads, d)
        k = k.reshape(n, cfg.num_kv_heads, d)
        v = v.reshape(n, cfg.num_kv_heads, d)
        k_cache, v_cache = kv.k[pool_layer], kv.v[pool_layer]
        norms = (layer.q_norm, layer.k_norm) if cfg.qk_norm else None
        q = ops.attention_inputs(
            q, k, v, cos, sin, k_cache, v_cache, batch.slot_mapping, cfg.rope_dim, norms, eps
        )
        attn = ops.attention(q, k_cache, v_cache, batch).reshape(n, cfg.q_size)
        if gate:
            attn = attn * torch.sigmoid(gate[0])
        return ops.linear(attn, layer.o)

    def _reduce(self, partial: torch.Tensor) -> torch.Tensor:
        return partial if self.comm is None else self.comm.all_reduce(partial)

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        if self.comm is None:
            return self.weights.embed[ids]
        # vocab-parallel: each rank embeds the ids in its range, zeros elsewhere; the sum is exact
        local = ids - self.vocab_start
        inside = (local >= 0) & (local < self.cfg.vocab_size)
        rows = self.weights.embed[local.clamp(0, self.cfg.vocab_size - 1)]
        return self.comm.all_reduce(torch.where(inside[:, None], rows, torch.zeros_like(rows)))
