"""A hybrid (gated DeltaNet + gated attention, or Nemotron-H's Mamba-2 blocks) or a mixture of
experts on random weights of a real shape: lanes' batch-1 decode and long-prompt prefill in exact
mode, and transformers' own implementation (Qwen3.5, Qwen3.5-MoE, Qwen3-MoE, Nemotron-H) on the
same shape in the same run (issue 18's GPU figures).

    python -m bench.speed.hybrid [--shape qwen3.5-2b-like] [--prefill 8192] [--repeats 3]
    python -m bench.speed.hybrid --shape qwen3-30b-a3b-like   (or qwen3.5-35b-a3b-like,
                                                               nemotron-h-8b-like)
    python -m bench.speed.hybrid --graphs both     (decode and prefill without, then with CUDA graphs)
    python -m bench.speed.hybrid --delta-rule both (the DeltaNet layers row by row, then chunked)

Writes bench/results/hybrid-<shape>-<device>.json. transformers runs its own weights (random,
the same shape): the comparison is of speed, not of outputs.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch

from bench import RESULTS
from bench.shapes import SHAPES, hf_fields, hf_random_model, random_checkpoint
from bench.speed.decode_prefill import decode_tok_s, prefill_s
from lanes import EngineConfig, build_engine
from lanes.config import ModelConfig


def partial_rope(config: ModelConfig) -> dict:
    """transformers' rope_parameters for RoPE on the first rope_dim dims of each head."""
    return {
        "rope_type": "default",
        "rope_theta": config.rope_theta,
        "partial_rotary_factor": config.rope_dim / config.head_dim,
    }


def hf_model(config: ModelConfig, device: str):
    """transformers' model of this shape's family (Qwen3.5 dense or MoE, Qwen3-MoE, GLM-4 MoE,
    Nemotron-H), random bf16 weights on the device."""
    import transformers

    if config.family == "nemotron_h":
        m, names = config.mamba, {"linear_attention": "mamba", "full_attention": "attention"}
        hf_config = transformers.NemotronHConfig(
            **hf_fields(config),
            layers_block_type=[names.get(t, t) for t in config.layer_types],
            mamba_num_heads=m.heads,
            mamba_head_dim=m.head_dim,
            ssm_state_size=m.state,
            n_groups=m.groups,
            conv_kernel=m.kernel,
            layer_norm_epsilon=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=config.tie_word_embeddings,
        )
        return hf_random_model(transformers.NemotronHForCausalLM, hf_config, device)
    if config.family == "glm4_moe":
        hf_config = transformers.Glm4MoeConfig(
            **hf_fields(config),
            n_routed_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            moe_intermediate_size=config.moe_intermediate_size,
            n_shared_experts=config.shared_expert_intermediate_size // config.moe_intermediate_size,
            first_k_dense_replace=min(config.moe_layers),
            n_group=config.n_group,
            topk_group=config.topk_group,
            routed_scaling_factor=config.routed_scaling_factor,
            norm_topk_prob=config.norm_topk_prob,
            attention_bias=config.qkv_bias,
            use_qk_norm=config.qk_norm,
            tie_word_embeddings=config.tie_word_embeddings,
            rope_parameters=partial_rope(config),
        )
        return hf_random_model(transformers.Glm4MoeForCausalLM, hf_config, device)
    if config.family == "qwen3_moe":
        hf_config = transformers.Qwen3MoeConfig(
            **hf_fields(config),
            num_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            moe_intermediate_size=config.moe_intermediate_size,
            norm_topk_prob=config.norm_topk_prob,
            decoder_sparse_step=1,
            mlp_only_layers=[i for i in range(config.num_layers) if i not in config.moe_layers],
            tie_word_embeddings=config.tie_word_embeddings,
            rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        )
        return hf_random_model(transformers.Qwen3MoeForCausalLM, hf_config, device)
    hybrid = dict(
        **hf_fields(config),
        layer_types=list(config.layer_types),
        linear_num_key_heads=config.linear_num_key_heads,
        linear_num_value_heads=config.linear_num_value_heads,
        linear_key_head_dim=config.linear_key_head_dim,
        linear_value_head_dim=config.linear_value_head_dim,
        linear_conv_kernel_dim=config.linear_conv_kernel,
        tie_word_embeddings=config.tie_word_embeddings,
        rope_parameters=partial_rope(config),
    )
    if config.family == "qwen3_5_moe":
        hf_config = transformers.Qwen3_5MoeTextConfig(
            **hybrid,
            num_experts=config.num_experts,
            num_experts_per_tok=config.experts_per_token,
            moe_intermediate_size=config.moe_intermediate_size,
            shared_expert_intermediate_size=config.shared_expert_intermediate_size,
        )
        return hf_random_model(transformers.Qwen3_5MoeForCausalLM, hf_config, device)
    hf_config = transformers.Qwen3_5TextConfig(**hybrid)
    return hf_random_model(transformers.Qwen3_5ForCausalLM, hf_config, device)


def hf_speeds(model, vocab: int, device: str, new_tokens: int, prefill: int, repeats: int):
    """(decode tok/s after a 128-token prompt, seconds of one forward over `prefill` tokens, or
    None where that forward runs out of GPU memory: transformers' torch Mamba-2 scan asks for
    64 GiB at 8K), medians of `repeats` after a warm-up."""
    decode, forward = [], []

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    with torch.no_grad():
        for i in range(repeats + 1):
            prompt = torch.randint(0, vocab, (1, 128), device=device)
            sync()
            start = time.perf_counter()
            model.generate(prompt, max_new_tokens=1, do_sample=False, pad_token_id=0)
            sync()
            first = time.perf_counter() - start
            start = time.perf_counter()
            model.generate(
                prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                pad_token_id=0,
            )  # fmt: skip
            sync()
            total = time.perf_counter() - start
            if i:  # the prompt's own forward taken out of the decode time
                decode.append((new_tokens - 1) / max(total - first, 1e-9))
        for i in range(repeats + 1):
            ids = torch.randint(0, vocab, (1, prefill), device=device)
            sync()
            start = time.perf_counter()
            try:
                model(ids, logits_to_keep=1, use_cache=False)
            except torch.OutOfMemoryError:
                return statistics.median(decode), None
            sync()
            if i:
                forward.append(time.perf_counter() - start)
    return statistics.median(decode), statistics.median(forward)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", default="qwen3.5-2b-like", choices=sorted(SHAPES))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prefill", type=int, default=8192)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--graphs", choices=("on", "off", "both"), default="on", help="CUDA graphs")
    ap.add_argument(
        "--delta-rule", choices=("recurrent", "chunked", "both"), default="recurrent",
        help="the DeltaNet layers' form (chunked: kernels/chunked_delta.py, no CUDA graphs)",
    )  # fmt: skip
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    config = SHAPES[args.shape]
    checkpoint = random_checkpoint(config, args.device)
    report = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "shape": args.shape,
        "batch": 1,
    }
    graph_modes = ("off", "on") if args.graphs == "both" else (args.graphs,)
    rules = ("recurrent", "chunked") if args.delta_rule == "both" else (args.delta_rule,)
    for graphs, rule in ((g, r) for r in rules for g in graph_modes):
        engine = build_engine(
            checkpoint=checkpoint,
            config=EngineConfig(
                device=args.device,
                prompt_cache_bytes=0,
                kv_cache_bytes=8 * 2**30,  # the 35B-A3B shape's 16 state slots take 1.1 GB
                prefill_chunk=args.prefill,
                max_tokens_per_round=args.prefill,
                cuda_graphs=graphs == "on",
                delta_rule=rule,
            ),
        )
        decode = [
            decode_tok_s(engine, config.vocab_size, args.new_tokens, i)
            for i in range(args.repeats + 1)
        ]
        prefill = [
            prefill_s(engine, config.vocab_size, args.prefill, 100 + i)
            for i in range(args.repeats + 1)
        ]
        replays = 0 if engine.runner.graphs is None else engine.runner.graphs.num_replays
        key = "lanes_exact" + ("" if graphs == "on" else "_no_graphs")
        report[key + ("_chunked" if rule == "chunked" else "")] = {
            "decode_tok_s": statistics.median(decode[1:]),
            f"prefill_{args.prefill}_s": statistics.median(prefill[1:]),
            "graph_replays": replays,
        }
        print(json.dumps(report, indent=1), flush=True)
        del engine
        gc.collect()  # the engine's cycles hold its weights and caches until collected
        if args.device == "cuda":
            torch.cuda.empty_cache()
    del checkpoint
    gc.collect()
    if args.device == "cuda":
        torch.cuda.empty_cache()
    if not args.skip_hf:
        model = hf_model(config, args.device)
        tok_s, forward_s = hf_speeds(
            model, config.vocab_size, args.device, args.new_tokens, args.prefill, args.repeats
        )
        report["transformers"] = {
            "decode_tok_s": tok_s,
            f"prefill_{args.prefill}_s": forward_s,  # None: out of GPU memory
            # without flash-linear-attention transformers runs its torch reference of the rule
            "flash_linear_attention": importlib.util.find_spec("fla") is not None,
        }
    print(json.dumps(report, indent=1), flush=True)
    out = Path(args.out or RESULTS / f"hybrid-{args.shape}-{args.device}.json")
    out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
