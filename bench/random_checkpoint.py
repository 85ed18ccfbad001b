"""A random-weight HF checkpoint directory of the default model's shape (SmolLM2-135M: llama,
30 layers, hidden 576) with a real tokenizer, for serving benchmarks on a machine the real weights
cannot be carried to: speed and grammar masks depend on the shapes and the tokenizer, not on the
weights' values.

    python -m bench.random_checkpoint --tokenizer DIR --out /tmp/rand135
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from lanes.config import ModelConfig
from lanes.models.weights import expected_shapes

SMOLLM2_135M = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", required=True, help="a folder with tokenizer.json")
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SMOLLM2_135M))
    for f in Path(args.tokenizer).iterdir():
        shutil.copy(f, out / f.name)
    cfg = ModelConfig.from_hf(SMOLLM2_135M)
    gen = torch.Generator().manual_seed(args.seed)
    tensors = {}
    for name, shape in expected_shapes(cfg).items():
        if "norm" in name:
            tensors[name] = torch.ones(shape, dtype=torch.bfloat16)
        else:
            tensors[name] = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
    save_file(tensors, str(out / "model.safetensors"))
    print(f"wrote {out}: {sum(t.numel() for t in tensors.values()) / 1e6:.1f}M parameters")


if __name__ == "__main__":
    main()
