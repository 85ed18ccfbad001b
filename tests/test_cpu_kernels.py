"""The CPU's C kernels (kernels/*_cpu.c, built at first use by kernels/native.py): each close to
its torch reference, and a row's bits never depending on the rest of the call. The negative
controls run the same row checks on the torch forms that are not batch-invariant."""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn.functional as F

from lanes.kernels import attention_cpu, native, packed_linear_cpu, rows_cpu
from lanes.packed import PackedWeight, dequantize
from tests.test_exact_batching import _attention_rows_agree

needs_compiler = pytest.mark.skipif(native.compiler() is None, reason="no C compiler here")
pytestmark = needs_compiler


def _packed(n: int, k: int, bits: int, group: int, gen: torch.Generator) -> PackedWeight:
    words = torch.randint(0, 2**32, (n, k * bits // 32), generator=gen, dtype=torch.int64)
    scales = torch.rand((n, k // group), generator=gen) * 0.02
    biases = torch.randn((n, k // group), generator=gen) * 0.02
    return PackedWeight(words.to(torch.uint32), scales, biases, bits, group)


def test_the_kernels_build_where_there_is_a_compiler():
    assert packed_linear_cpu.available()
    assert attention_cpu._kernel() is not None and rows_cpu._lib() is not None


@pytest.mark.parametrize("bits,group", [(4, 32), (8, 32), (4, 64), (4, 128), (8, 128)])
def test_packed_linear_matches_the_dequantized_weight(bits, group):
    gen = torch.Generator().manual_seed(bits * group)
    w = _packed(200, 512, bits, group, gen)
    x, bias = torch.randn((9, 512), generator=gen), torch.randn((200,), generator=gen)
    assert packed_linear_cpu.takes(w)
    ours = packed_linear_cpu.packed_linear(x, w, bias)
    ref = packed_linear_cpu.ref_packed_linear(x, w, bias)  # in float64
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-6 * ref.abs().max().item())


def test_packed_linear_of_no_rows():
    """A forward whose chunks want no logits hands the LM head zero rows."""
    w = _packed(64, 128, 4, 32, torch.Generator().manual_seed(9))
    assert packed_linear_cpu.packed_linear(torch.zeros((0, 128)), w).shape == (0, 64)


def test_packed_linear_with_the_glu_input():
    """The down projection reading silu(gate) * up from the gate/up output directly."""
    gen = torch.Generator().manual_seed(7)
    w = _packed(96, 256, 4, 32, gen)
    gate_up = torch.randn((37, 512), generator=gen)
    ours = packed_linear_cpu.packed_linear(gate_up, w, glu=True)
    ref = packed_linear_cpu.ref_packed_linear(gate_up, w, glu=True)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert _rows_keep_their_bits(lambda t: packed_linear_cpu.packed_linear(t, w, glu=True), gate_up)


def test_packed_linear_reads_the_even_input_from_the_low_nibble():
    """A code's place in its byte matters: swapping every byte's nibbles is another weight."""
    gen = torch.Generator().manual_seed(1)
    w = _packed(64, 256, 4, 32, gen)
    raw = w.codes.view(torch.uint8)
    swapped = PackedWeight(((raw << 4) | (raw >> 4)).view(torch.uint32), w.scales, w.biases, 4, 32)
    x = torch.randn((1, 256), generator=gen)
    ref = packed_linear_cpu.ref_packed_linear(x, w)
    torch.testing.assert_close(packed_linear_cpu.packed_linear(x, w), ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(packed_linear_cpu.packed_linear(x, swapped), ref, atol=1e-3)


def _rows_keep_their_bits(linear, x: torch.Tensor) -> bool:
    """Whether linear(rows) gives every row the bits it has alone, for calls of 1..9 rows
    starting anywhere (the kernel shares a weight vector 4 rows at a time) and all 37 rows."""
    alone = torch.cat([linear(x[i : i + 1]) for i in range(x.shape[0])])
    same = torch.equal(linear(x), alone)
    for start, count in [(0, 2), (1, 3), (2, 4), (3, 5), (5, 9), (30, 7)]:
        same &= torch.equal(linear(x[start : start + count]), alone[start : start + count])
    return same


@pytest.mark.parametrize("bits", [4, 8])
def test_packed_linear_rows_do_not_depend_on_their_company(bits):
    gen = torch.Generator().manual_seed(2)
    w = _packed(1536, 576, bits, 32, gen)
    x = torch.randn((37, 576), generator=gen)
    assert _rows_keep_their_bits(lambda t: packed_linear_cpu.packed_linear(t, w), x)


def test_negative_control_a_float_linear_over_the_same_weight_depends_on_its_company():
    """The same check on F.linear over the dequantized weight (one BLAS call per batch, as the
    fast ops do): BLAS takes other paths for other row counts, and the check sees it."""
    gen = torch.Generator().manual_seed(2)
    w = _packed(1536, 576, 4, 32, gen)
    dense = dequantize(w.codes, w.scales, w.biases, w.bits, w.group)
    x = torch.randn((37, 576), generator=gen)
    assert not _rows_keep_their_bits(lambda t: F.linear(t, dense), x)


def _cpu_attention(q, k_cache, v_cache, batch):
    """The kernel over a forward's lanes as plain numbers (what ExactOps.prepare hands it)."""
    lanes = [(s.query_start, s.num_queries, s.first_position, s.kv_slots) for s in batch.seqs]
    return attention_cpu.attention(q, k_cache, v_cache, attention_cpu.LaneRows.of(lanes))


def test_attention_rows_keep_their_bits_across_chunks_and_lanes():
    """A query's bits alone as a decode row, in a long prefill, in a chunk starting mid-tile
    and beside another lane (the negative control: test_exact_batching's SDPA check)."""
    assert _attention_rows_agree(_cpu_attention)


def test_attention_matches_sdpa():
    from lanes.attention import sdpa_attention
    from lanes.batch import ForwardBatch, SeqSlice

    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim, ctx = 8, 2, 64, 150
    k_cache, v_cache = (torch.randn((ctx + 10, kv_heads, dim), generator=gen) for _ in range(2))
    slots = torch.randperm(ctx + 10, generator=gen)[:ctx]
    q = torch.randn((50, heads, dim), generator=gen)
    seqs = (SeqSlice(0, 20, 20, slots[:20]), SeqSlice(20, 30, ctx, slots))  # prefill; a chunk
    none = torch.zeros(0, dtype=torch.int64)
    batch = ForwardBatch(none, none, none, seqs, none)
    assert attention_cpu.takes(q, k_cache, v_cache)
    torch.testing.assert_close(
        _cpu_attention(q, k_cache, v_cache, batch),
        sdpa_attention(q, k_cache, v_cache, batch),
        rtol=1e-5,
        atol=1e-5,
    )


def test_add_rms_norm_matches_the_torch_form_and_keeps_rows():
    from lanes.ops import rms_norm

    gen = torch.Generator().manual_seed(4)
    x, residual = torch.randn((13, 576), generator=gen), torch.randn((13, 576), generator=gen)
    weight = torch.randn((576,), generator=gen)
    summed, normed = rows_cpu.rms_norm(x, weight, 1e-5, residual)
    assert torch.equal(summed, residual + x)
    torch.testing.assert_close(normed, rms_norm(residual + x, weight, 1e-5), rtol=1e-5, atol=1e-5)
    for i in (0, 7, 12):
        alone = rows_cpu.rms_norm(x[i : i + 1], weight, 1e-5, residual[i : i + 1])[1]
        assert torch.equal(alone[0], normed[i])


@pytest.mark.parametrize("rope_dim", [64, 16])
def test_rope_write_is_the_torch_steps(rope_dim):
    """RoPE and the KV write from column views of one fused projection: the torch steps'
    (Ops.attention_inputs) bits, full and partial rotary dims."""
    from lanes.ops import ExactOps, Ops

    gen = torch.Generator().manual_seed(5)
    tokens, heads, kv_heads, d = 7, 6, 2, 64
    qkv = torch.randn((tokens, (heads + 2 * kv_heads) * d), generator=gen)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    q, k, v = (t.view(tokens, -1, d) for t in (q, k, v))
    angles = torch.rand((tokens, rope_dim // 2), generator=gen) * 6
    cos, sin = angles.cos(), angles.sin()
    slots = torch.tensor([9, 3, 0, 14, 5, 6, 11])
    caches = [torch.zeros((16, kv_heads, d)) for _ in range(4)]
    assert rows_cpu.takes_rope_write(q, k, v, cos, caches[0], rope_dim)  # the C path, not torch
    ours = ExactOps().attention_inputs(q, k, v, cos, sin, *caches[:2], slots, rope_dim)
    theirs = Ops.attention_inputs(ExactOps(), q, k, v, cos, sin, *caches[2:], slots, rope_dim)
    assert torch.equal(ours, theirs)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


def test_without_a_compiler_the_torch_path_serves(monkeypatch, tmp_path, caplog):
    """No compiler (or LANES_NATIVE=0): `load` gives None with one warning, and the ops keep
    the torch forms; nothing fails."""
    monkeypatch.setenv("LANES_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "compiler", lambda: None)
    with caplog.at_level(logging.WARNING, logger="lanes"):
        assert native.load.__wrapped__("rows_cpu.c") is None
    assert "no C compiler" in caplog.text
    monkeypatch.setenv("LANES_NATIVE", "0")
    assert native.load.__wrapped__("rows_cpu.c") is None


def test_a_failed_build_is_reported_and_not_cached(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv("LANES_CACHE", str(tmp_path))
    monkeypatch.setattr(native, "SOURCES", tmp_path)
    (tmp_path / "broken.c").write_text("int f( {\n")
    with caplog.at_level(logging.WARNING, logger="lanes"):
        assert native.load.__wrapped__("broken.c") is None
    assert "building broken.c failed" in caplog.text
    assert not list((tmp_path / "native").glob("*.so"))


def test_a_library_that_does_not_load_falls_back(monkeypatch, caplog):
    def refuse(path):
        raise OSError("wrong ELF class")

    monkeypatch.setattr(native.ctypes, "CDLL", refuse)
    with caplog.at_level(logging.WARNING, logger="lanes"):
        assert native.load.__wrapped__("rows_cpu.c") is None
    assert "wrong ELF class" in caplog.text


def test_gguf_codes_stay_packed_by_default_only_where_the_c_kernel_serves_them():
    from lanes.build import keeps_gguf_packed
    from lanes.config import EngineConfig

    assert keeps_gguf_packed(EngineConfig())
    assert not keeps_gguf_packed(EngineConfig(exact=False))
    assert not keeps_gguf_packed(EngineConfig(device="cuda"))
    assert not keeps_gguf_packed(EngineConfig(kernels="triton"))
    assert not keeps_gguf_packed(EngineConfig(gguf_packed=False))
    assert keeps_gguf_packed(EngineConfig(exact=False, gguf_packed=True))


@pytest.mark.skipif(not packed_linear_cpu.available(), reason="the C kernel did not build here")
def test_float_weights_through_the_kernel_match_float64():
    """float32 weights as they are (bits 32): the plain product and the MLP's silu(gate) * up
    input, within float32 rounding of a float64 matmul."""
    gen = torch.Generator().manual_seed(11)
    w = torch.randn((70, 96), generator=gen)
    x = torch.randn((9, 96), generator=gen)
    got = packed_linear_cpu.float_linear(x, w)
    torch.testing.assert_close(got, (x.double() @ w.double().T).float(), rtol=1e-5, atol=1e-5)
    gate_up = torch.randn((9, 192), generator=gen)
    gate, up = gate_up.double().chunk(2, dim=-1)
    want = ((torch.nn.functional.silu(gate) * up) @ w.double().T).float()
    torch.testing.assert_close(packed_linear_cpu.float_linear(gate_up, w, glu=True), want,
                               rtol=1e-5, atol=1e-5)  # fmt: skip
    assert not packed_linear_cpu.takes_float(w[:, :80])  # k not a multiple of 32
