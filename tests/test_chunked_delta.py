"""The gated delta rule in chunks anchored at absolute positions (kernels/chunked_delta.py):
the chunk algebra against the row-by-row recurrence, and the property it exists for, bitwise:
a row's bits do not depend on where a lane's forwards begin and end (prompt chunks of any size,
decode rows one at a time, verify rows across a chunk boundary, a resume from a chunk
boundary's state). Negative controls: the chunk grid restarted at each forward's first row,
and the recurrent kernel's rows at the same positions, give other bits. On the CPU the
kernels run interpreted (conftest)."""

from __future__ import annotations

import pytest
import torch

from lanes.kernels.chunked_delta import (
    CHUNK,
    ChunkCarry,
    chunked_gated_delta,
    ref_chunked_gated_delta,
)
from lanes.kernels.delta_rule import delta_rule_steps, gated_delta
from lanes.kernels.registry import _delta_rows, _delta_weights, _rand

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ROWS = 2 * CHUNK + 22  # two whole chunks and part of a third


def _lane(seed: int, rows: int = ROWS, hk: int = 2):
    gen = torch.Generator().manual_seed(seed)
    w = _delta_weights(torch.float32, DEVICE, gen, hk=hk)
    mixed, z, b, a = _delta_rows(w, rows, torch.float32, DEVICE, gen)
    conv = _rand((w.taps.shape[0], w.taps.shape[1] - 1), torch.float32, DEVICE, gen)
    state = _rand((w.value_heads, w.key_dim, w.value_dim), torch.float32, DEVICE, gen, 0.1)
    return mixed, z, b, a, conv, state, w


def _in_forwards(cuts, mixed, z, b, a, carry, w, rule=chunked_gated_delta):
    """The lane's rows as forwards ending at `cuts`: (every row's output, the last carry)."""
    outs, start = [], 0
    for end in cuts:
        rows = slice(start, end)
        out, carry = rule(mixed[rows], z[rows], b[rows], a[rows], carry, w)
        outs.append(out)
        start = end
    return torch.cat(outs), carry


@pytest.mark.parametrize("hk", [2, 4], ids=["grouped", "one key head each"])
def test_the_chunks_follow_the_recurrence(hk):
    """The torch form of the chunk algebra and the row-by-row recurrence agree to float32
    rounding, on the outputs and on the state after the whole chunks; the carry keeps the
    partial chunk's rows."""
    mixed, z, b, a, conv, state, w = _lane(0, hk=hk)
    rows_out, rows_conv, _ = delta_rule_steps(mixed, z, b, a, conv, state, w)
    out, carry = ref_chunked_gated_delta(mixed, z, b, a, ChunkCarry.start(conv, state), w)
    torch.testing.assert_close(out, rows_out, rtol=1e-4, atol=1e-5)
    whole = 2 * CHUNK
    _, _, state_at_whole = delta_rule_steps(
        mixed[:whole], None, b[:whole], a[:whole], conv, state, w
    )
    torch.testing.assert_close(carry.state, state_at_whole, rtol=1e-4, atol=1e-5)
    assert carry.position == ROWS and carry.num_partial == ROWS - whole
    assert torch.equal(carry.conv, rows_conv)
    assert carry.k[carry.num_partial :].abs().sum() == 0 and carry.k[0].abs().sum() > 0


def test_the_kernels_match_the_torch_form():
    """The Triton kernels against the torch form, from a carry holding part of a chunk."""
    mixed, z, b, a, conv, state, w = _lane(1)
    _, carry = ref_chunked_gated_delta(
        mixed[:40], None, b[:40], a[:40], ChunkCarry.start(conv, state, CHUNK), w
    )
    rest = slice(40, None)
    out, after = chunked_gated_delta(mixed[rest], z[rest], b[rest], a[rest], carry, w)
    ref_out, ref_after = ref_chunked_gated_delta(mixed[rest], z[rest], b[rest], a[rest], carry, w)
    torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
    for name in ("conv", "state", "k", "v", "beta", "g"):
        torch.testing.assert_close(getattr(after, name), getattr(ref_after, name))
    assert after.position == ref_after.position == CHUNK + ROWS


def test_a_row_s_bits_do_not_depend_on_where_forwards_split():
    """Prompt chunks that end anywhere, decode rows one at a time, a verify span across a
    chunk boundary, and a resume from the state saved at a chunk boundary: every row and the
    final carry bitwise as one forward gives them."""
    mixed, z, b, a, conv, state, w = _lane(2)
    start = ChunkCarry.start(conv, state)
    whole, end = _in_forwards([ROWS], mixed, z, b, a, start, w)
    cuts = [37, 70, 71, 72, 126, 131, 132, ROWS]  # prompt, prompt, decode x2, a verify span...
    split, carry = _in_forwards(cuts, mixed, z, b, a, start, w)
    assert torch.equal(split, whole)
    for name in ("conv", "state", "k", "v", "beta", "g"):
        assert torch.equal(getattr(carry, name), getattr(end, name)), name
    # a resume at the chunk boundary 2 * CHUNK: the state and conv window saved there
    _, at_boundary = _in_forwards([2 * CHUNK], mixed, z, b, a, start, w)
    resumed = ChunkCarry.start(at_boundary.conv, at_boundary.state, 2 * CHUNK)
    tail = slice(2 * CHUNK, None)
    out, _ = chunked_gated_delta(mixed[tail], z[tail], b[tail], a[tail], resumed, w)
    assert torch.equal(out, whole[tail])


def test_negative_controls_other_anchors_and_the_recurrent_rows_give_other_bits():
    """What the anchoring guards against. (1) The chunk grid restarted at each forward's first
    row, from the state the rows before it reached (chunks anchored at the prompt chunk's
    start): later rows change bits. (2) The recurrent kernel's rows at the same positions (a
    plain recurrent decode beside a chunked prompt): other bits, though equal to rounding."""
    mixed, z, b, a, conv, state, w = _lane(3)
    start = ChunkCarry.start(conv, state)
    whole, _ = _in_forwards([ROWS], mixed, z, b, a, start, w)

    def anchored_at_each_forward(m, zz, bb, aa, carry, w):
        out, after = chunked_gated_delta(m, zz, bb, aa, carry, w)
        # the state the recurrence reaches after these rows, as if a chunk ended there
        _, _, reached = delta_rule_steps(m, None, bb, aa, carry.conv, carry.state, w)
        return out, ChunkCarry.start(after.conv, reached)

    cuts = [37, 70, ROWS]
    relative, _ = _in_forwards(cuts, mixed, z, b, a, start, w, anchored_at_each_forward)
    assert torch.equal(relative[:37], whole[:37]) and not torch.equal(relative[37:], whole[37:])

    recurrent, _, _ = gated_delta(mixed, z, b, a, conv, state, w)
    torch.testing.assert_close(recurrent, whole, rtol=1e-4, atol=1e-5)
    assert not torch.equal(recurrent[2 * CHUNK :], whole[2 * CHUNK :])
