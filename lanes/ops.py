"""The ops interface: every numeric step of a forward goes through one of these methods.

`ExactOps` (the default) is batch-invariant on the CPU: a row's result never depends on the other
rows in the call. Row-wise ops run on fixed-size row tiles (the last one padded), so the BLAS call
shape never changes with the number of tokens; attention reduces keys in fixed absolute-position
tiles. `FastOps` is plain torch (one matmul per linear, SDPA):
the speed baseline and the negative control of the exactness tests. Triton kernels (kernels/)
implement the same interface on the GPU.
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import torch.nn.functional as F

from lanes.attention import exact_attention, sdpa_attention
from lanes.batch import ForwardBatch
from lanes.kernels import attention_cpu, rows_cpu
from lanes.kernels.delta_rule import DeltaRuleWeights, delta_rule_steps, ref_gated_delta_lanes
from lanes.kernels.mamba2 import Mamba2Rule, mamba2_steps, ref_ssd_scan_lanes
from lanes.kernels.moe_route import ref_combine_experts, ref_route_experts
from lanes.kernels.packed_linear_cpu import float_linear, packed_linear, takes, takes_float
from lanes.packed import OUT_TILE, PackedWeight

# The BLAS row tiles below serve what the C kernel does not (`_on_float_kernel`: float32 weights
# whose inputs are a multiple of 32, where the kernel built): other dtypes, odd widths, no compiler.
# Rows per BLAS call. MKL takes 1-2 rows down a matrix-vector path and 4 or more down a GEMM
# whose cost hardly falls with fewer rows, so a decode row padded to 16 rows paid several times
# over in its linears. Two rows (bench_generate --row-tiles 16,2, dev box, default model): 8.9 ->
# 18.9 tok/s decoding, a fresh 1,000-token prefill 4.5 -> 6.3 s.
ROW_TILE = 2
# ... except for weights with fewer than NARROW output rows: there MKL treats the 2 rows as the
# matrix and the weight as the vector, and a row's sum depends on its place in the tile (found by
# the MoE shared-expert gate, N = 1); 16-row tiles are a GEMM whatever the weight.
NARROW, NARROW_ROW_TILE = 8, 16
# A tile as weight @ tile.T (the weight the row-major operand) rather than tile @ weight.T: on an
# AMD EPYC with 2 threads MKL streamed a 2-row tile's weight at ~6 GB/s the usual way and at
# memory speed this way (bench/NOTES.md). Taken per weight shape where this machine's BLAS gives
# a row the same bits in either column of the tile (`weight_major_is_invariant`).
WEIGHT_MAJOR = True


class Ops:
    """Base: rope, the residual add + norm and the KV write have plain-torch defaults;
    subclasses give the rest. (Sampling is lanes.sampling.sample_row, one row at a time.)"""

    name: str
    is_batch_invariant: bool
    # DeltaNet layers in chunks anchored at absolute positions (kernels/chunked_delta.py) rather
    # than row by row; their state slots then hold a ChunkCarry (recurrent_layout)
    chunked_delta: bool = False

    def linear(self, x: torch.Tensor, weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [rows, in] @ weight[out, in].T (+ bias) -> [rows, out]. A PackedWeight is
        dequantized in its fixed tiles of output rows, each through the float linear."""
        if not isinstance(weight, PackedWeight):
            return self._linear(x, weight, bias)
        out = weight.shape[0]
        parts = [
            self._linear(
                x,
                weight.rows(i, min(i + OUT_TILE, out)),
                None if bias is None else bias[i : i + OUT_TILE],
            )
            for i in range(0, out, OUT_TILE)
        ]
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)

    def _linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        """The float linear."""
        raise NotImplementedError

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm over the last dim of x [rows, dim], computed in float32."""
        raise NotImplementedError

    def attention(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, batch: ForwardBatch
    ) -> torch.Tensor:
        """Causal paged attention; q [num_tokens, num_heads, head_dim]."""
        raise NotImplementedError

    def prepare(self, batch: ForwardBatch) -> ForwardBatch:
        """Per-forward metadata the ops need (built once, carried on the batch)."""
        return batch

    def add_rms_norm(
        self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(residual + x, rms_norm(residual + x)): the residual stream's add, then its norm."""
        summed = residual + x
        return summed, self.rms_norm(summed, weight, eps)

    def write_kv(self, k_cache, v_cache, slots, k, v) -> None:
        """Store k, v [T, HKV, D] at slots [T] of the layer's caches [S, HKV, D]."""
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v)

    def glu_linear(self, gate_up: torch.Tensor, weight) -> torch.Tensor:
        """The MLP's down projection of a fused gate/up output [rows, 2I]: linear(silu(gate) *
        up, weight)."""
        gate, up = gate_up.chunk(2, dim=-1)
        return self.linear(F.silu(gate) * up, weight)

    def experts(
        self, x: torch.Tensor, experts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor
    ) -> torch.Tensor:
        """A mixture-of-experts layer's routed MLPs: x [n, hidden], experts [n, k] (each token's
        chosen expert ids), gate_up [E, 2I, hidden], down [E, hidden, I] -> [n * k, hidden], row
        t * k + j the output of token t's j-th expert. Here expert by expert through the
        row-independent linears (which experts a batch uses is read on the host)."""
        k = experts.shape[1]
        outputs = x.new_zeros(x.shape[0] * k, down.shape[1])
        chosen = experts.reshape(-1)
        for e in torch.unique(chosen).tolist():
            slots = (chosen == e).nonzero().squeeze(1)
            outputs[slots] = self.glu_linear(self.linear(x[slots // k], gate_up[e]), down[e])
        return outputs

    def route_experts(
        self, router_logits: torch.Tensor, k: int, normalise: bool
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(weights fp32 [n, k], expert ids int64 [n, k]) from router logits [n, E], best
        first: softmax in fp32, equal probabilities rank by expert id, the chosen weights
        renormalised to sum to 1 if asked."""
        return ref_route_experts(router_logits, k, normalise)

    def combine_experts(self, outputs: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """outputs [n * k, hidden] (as `experts` returns them), weights [n, k] in their dtype ->
        [n, hidden]: each token's experts weighted and summed in its own rank order, best
        first, not in an order set by the batch."""
        return ref_combine_experts(outputs, weights)

    def attention_inputs(
        self, q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim: int, norms=None, eps=0.0
    ) -> torch.Tensor:
        """Per-head RMSNorm of q and k when norms = (q_norm, k_norm), RoPE on each head's first
        rope_dim dims, k and v written at their slots; returns q [T, HQ, D]. q, k, v [T, H, D]
        may be column views of one fused projection's output."""
        d = q.shape[-1]
        if norms is not None:
            q = self.rms_norm(q.reshape(-1, d), norms[0], eps).view(q.shape)
            k = self.rms_norm(k.reshape(-1, d), norms[1], eps).view(k.shape)
        q, k = self._partial_rope(q, cos, sin, rope_dim), self._partial_rope(k, cos, sin, rope_dim)
        self.write_kv(k_cache, v_cache, slots, k, v.contiguous())
        return q

    def delta_rule(
        self, mixed, z, b, a, conv, state, w: DeltaRuleWeights, position: int = 0
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """One lane's rows from `position` through a DeltaNet layer's conv and gated delta rule
        (the torch form in kernels/delta_rule.py): (out [T, value_heads, dv], or None without
        z; conv and state after the last row). Position by position, in a fixed order:
        batch-invariant (the row-by-row form does not need the position)."""
        return delta_rule_steps(mixed, z, b, a, conv, state, w)

    def delta_rule_lanes(
        self, mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance: bool
    ) -> torch.Tensor:
        """Lanes of rows_per_lane rows, their states in pool slots (a device tensor): the outputs
        [lanes * T, value_heads, dv]; with `advance` each slot then holds the state after its
        lane's last row (kernels/delta_rule.gated_delta_lanes)."""
        return ref_gated_delta_lanes(
            mixed, z, b, a, conv_pool, state_pool, slots, rows_per_lane, w, advance
        )

    def mamba2(
        self, xbc, z, dt, conv, state, w: Mamba2Rule
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """One lane's rows through a Mamba-2 layer's conv and scan (the torch form in
        kernels/mamba2.py): (out [T, inner], or None without z; conv and state after the last
        row). Position by position, in a fixed order: batch-invariant."""
        return mamba2_steps(xbc, z, dt, conv, state, w)

    def mamba2_lanes(
        self, xbc, z, dt, conv_pool, state_pool, slots, rows_per_lane, w, advance: bool
    ) -> torch.Tensor:
        """As delta_rule_lanes, for a Mamba-2 layer (kernels/mamba2.ssd_scan_lanes)."""
        return ref_ssd_scan_lanes(
            xbc, z, dt, conv_pool, state_pool, slots, rows_per_lane, w, advance
        )

    def _partial_rope(self, x, cos, sin, rope_dim: int) -> torch.Tensor:
        if rope_dim == x.shape[-1]:
            return self.rope(x.contiguous(), cos, sin)
        head = self.rope(x[..., :rope_dim].contiguous(), cos, sin)
        return torch.cat([head, x[..., rope_dim:]], dim=-1)

    def rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding, rotate-half layout: x [tokens, heads, head_dim]; cos, sin
        [tokens, head_dim / 2]. Elementwise, hence batch-invariant."""
        half = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Plain-torch RMSNorm over the last dim, in float32 (the ops' and the distill teacher's)."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


def _by_row_tiles(fn, x: torch.Tensor, tile: int | None = None) -> torch.Tensor:
    """Apply fn to x [rows, ...] in tiles of exactly `tile` rows (ROW_TILE unless given; the
    last padded with zeros)."""
    tile = tile or ROW_TILE
    rows = x.shape[0]
    pad = -rows % tile or (tile if rows == 0 else 0)  # zero rows: one all-padding tile
    if pad:
        x = torch.cat([x, x.new_zeros((pad, *x.shape[1:]))])
    out = torch.cat([fn(x[i : i + tile]) for i in range(0, x.shape[0], tile)])
    return out[:rows]


@functools.cache
def weight_major_is_invariant(n: int, k: int, dtype: torch.dtype) -> bool:
    """Whether weight [n, k] @ tile.T, for 2-row tiles, gives a row the same bits in either
    column whatever the other row holds, with this machine's BLAS (checked on random values: a
    kernel that treats the columns differently shows it at once, as MKL does for n = 1)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn((n, k), generator=gen).to(dtype)
    a, b, c = torch.randn((3, k), generator=gen).to(dtype)

    def column(first: torch.Tensor, second: torch.Tensor, j: int) -> torch.Tensor:
        return torch.mm(w, torch.stack([first, second]).T)[:, j]

    return torch.equal(column(a, b, 0), column(c, a, 1)) and torch.equal(
        column(a, b, 1), column(b, c, 0)
    )


def _on_packed_kernel(x: torch.Tensor, weight) -> bool:
    """Whether the C kernel reads this weight's 4/8-bit codes straight from memory (a row's
    bits never depend on the call's other rows there either); else Ops.linear's dequantized
    tiles."""
    return isinstance(weight, PackedWeight) and x.dtype == torch.float32 and takes(weight)


def _on_float_kernel(x: torch.Tensor, weight) -> bool:
    """Whether the same C kernel serves this float32 weight as it is: a row's bits never depend
    on the call's other rows, and rows share each chunk of the weight (2-4x faster than the
    BLAS row tiles below on the dev box at 1 to 64 rows: bench/NOTES.md, twentieth session)."""
    return (
        isinstance(weight, torch.Tensor)
        and x.dtype == torch.float32
        and x.device.type == "cpu"
        and takes_float(weight)
    )


class ExactOps(Ops):
    name = "exact"
    is_batch_invariant = True

    def linear(self, x, weight, bias=None):
        if _on_packed_kernel(x, weight):
            return packed_linear(x, weight, bias)
        if _on_float_kernel(x, weight):
            return float_linear(x, weight, bias)
        return super().linear(x, weight, bias)

    def glu_linear(self, gate_up, weight):
        if _on_packed_kernel(gate_up, weight):
            return packed_linear(gate_up, weight, glu=True)  # silu * up as the kernel reads x
        if _on_float_kernel(gate_up, weight):
            return float_linear(gate_up, weight, glu=True)
        return super().glu_linear(gate_up, weight)

    def _linear(self, x, weight, bias=None):
        if weight.shape[0] < NARROW:
            return _by_row_tiles(lambda t: F.linear(t, weight, bias), x, NARROW_ROW_TILE)
        if (  # as the probe's weight: contiguous and aligned (MKL's rounding follows alignment)
            WEIGHT_MAJOR
            and weight.is_contiguous()
            and weight.data_ptr() % 64 == 0
            and weight_major_is_invariant(*weight.shape, weight.dtype)
        ):

            def tile(t: torch.Tensor) -> torch.Tensor:
                out = torch.mm(weight, t.T).T  # t.T a view: the layout MKL streams fastest
                return out if bias is None else out + bias

            return _by_row_tiles(tile, x)
        return _by_row_tiles(lambda t: F.linear(t, weight, bias), x)

    def rms_norm(self, x, weight, eps):
        if rows_cpu.takes_norm(x, weight):
            return rows_cpu.rms_norm(x, weight, eps)[1]
        return _by_row_tiles(lambda t: rms_norm(t, weight, eps), x)

    def add_rms_norm(self, x, residual, weight, eps):
        if rows_cpu.takes_norm(x, weight) and residual.dtype == torch.float32:
            return rows_cpu.rms_norm(x, weight, eps, residual)
        return super().add_rms_norm(x, residual, weight, eps)

    def attention_inputs(
        self, q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim: int, norms=None, eps=0.0
    ):
        if norms is None and rows_cpu.takes_rope_write(q, k, v, cos, k_cache, rope_dim):
            return rows_cpu.rope_write(q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim)
        return super().attention_inputs(
            q, k, v, cos, sin, k_cache, v_cache, slots, rope_dim, norms, eps
        )

    def prepare(self, batch):
        if batch.input_ids.device.type != "cpu" or not attention_cpu.available():
            return batch
        return dataclasses.replace(batch, attn_meta=_cpu_lane_rows(batch))

    def attention(self, q, k_cache, v_cache, batch):
        if attention_cpu.takes(q, k_cache, v_cache):  # the C kernel: one call per lane
            meta = batch.attn_meta
            if not isinstance(meta, attention_cpu.LaneRows):
                meta = _cpu_lane_rows(batch)
            return attention_cpu.attention(q, k_cache, v_cache, meta)
        return exact_attention(q, k_cache, v_cache, batch)


def _cpu_lane_rows(batch) -> attention_cpu.LaneRows:
    """The CPU attention kernel's view of a forward's lanes, as plain numbers and slot tensors."""
    return attention_cpu.LaneRows.of(
        [(s.query_start, s.num_queries, s.first_position, s.kv_slots) for s in batch.seqs]
    )


class FastOps(Ops):
    name = "fast"
    is_batch_invariant = False

    def _linear(self, x, weight, bias=None):
        return F.linear(x, weight, bias)

    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)

    def attention(self, q, k_cache, v_cache, batch):
        return sdpa_attention(q, k_cache, v_cache, batch)
