"""Checkpoint layouts: sharded safetensors load like a single file; tied embeddings share memory."""

from __future__ import annotations

import torch

from lanes import build_engine
from lanes.models import open_checkpoint


def test_sharded_checkpoint_equals_single_file(tiny_models, tmp_path):
    path, hf = tiny_models["llama"]
    sharded = tmp_path / "sharded"
    hf.save_pretrained(sharded, safe_serialization=True, max_shard_size="40KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((path / name).read_bytes())
    assert (sharded / "model.safetensors.index.json").is_file()
    assert len(list(sharded.glob("*.safetensors"))) > 1
    ids = list(range(3, 40))
    (single,) = build_engine(str(path)).prompt_logits([ids])
    (split,) = build_engine(str(sharded)).prompt_logits([ids])
    assert torch.equal(single, split)


def test_tied_embeddings_share_the_table(tiny_models):
    tied = build_engine(str(tiny_models["smollm2"][0]))
    untied = build_engine(str(tiny_models["llama"][0]))
    assert open_checkpoint(str(tiny_models["smollm2"][0])).config.tie_word_embeddings
    w = tied.runner.decoder.weights
    assert w.lm_head.data_ptr() == w.embed.data_ptr()
    u = untied.runner.decoder.weights
    assert u.lm_head.data_ptr() != u.embed.data_ptr()


def test_weights_get_their_own_aligned_memory():
    """A weight that sits at an odd offset (a view into a memory-mapped shard) is copied to
    aligned memory: MKL rounds weight @ tile.T differently at another alignment, so the same
    weights would otherwise give other bits depending on how the checkpoint was split."""
    from lanes.models.weights import _own_memory

    buf = torch.arange(1 + 96 * 64, dtype=torch.float32)
    view = buf[1:].view(96, 64)  # 4 bytes past an aligned start
    assert view.data_ptr() % 64 != 0
    owned = _own_memory(view)
    assert owned.data_ptr() % 64 == 0 and owned.is_contiguous() and torch.equal(owned, view)
    aligned = torch.empty((96, 64))
    assert _own_memory(aligned) is aligned  # nothing copied when nothing needs it
