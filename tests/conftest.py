"""Fixtures: tiny random-weight checkpoints of every architecture, written like real ones."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import lanes  # noqa: F401  (first: maps the checkout's kernels/ so transformers finds its own)

# Tests never reach a model hub; the default model's wheel comes from the package index.
os.environ["HF_HUB_OFFLINE"] = "1"
# Without a GPU, Triton kernels run on its CPU interpreter; this must be set before Triton loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Under pytest-xdist each worker is a process of its own: one torch thread each keeps the
# workers from taking each other's cores (2 workers x 2 threads on CI's 2 cores ran slower).
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


def _interpreted_helpers_without_repatching() -> None:
    """Triton's interpreter patches triton.language for a kernel launch, and again (several
    inspect.getmembers sweeps, about 1 ms) on every call of a @triton.jit helper inside it,
    though the patch is usually still in place. The kernels call helpers per key tile and per
    partition, so on the interpreted tests that was about a quarter of the time (cProfile of a
    device-rounds test: 25.6 of 105 s). Here a helper repatches only where a language module
    its code sees (triton.language, or triton.language.core for Triton's own helpers such as
    tl.zeros) still has its builtins unpatched, judged by one of them (`full`: every sweep
    patches all of a module's builtins together). Where the interpreter is not shaped as
    expected, it is left alone."""
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:  # pragma: no cover
        return
    helper = getattr(interpreter, "InterpretedFunction", None)
    needed = ("rewrite", "_patch_lang", "InterpreterError")
    if helper is None or not all(hasattr(helper, n) or hasattr(interpreter, n) for n in needed):
        return
    langs_of: dict[int, list] = {}

    def call(self, *args, **kwargs):
        scope = self.fn.__globals__
        langs = langs_of.get(id(scope))
        if langs is None:
            langs = langs_of[id(scope)] = [v for v in scope.values() if v is tl or v is tl.core]
        if any(tl.core.is_builtin(lang.full) for lang in langs):
            interpreter._patch_lang(self.fn)
        fn = self.rewrite()
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    helper.__call__ = call


if os.environ.get("TRITON_INTERPRET") == "1":
    _interpreted_helpers_without_repatching()

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = [
    "The quick brown fox jumps over the lazy dog. " * 3,
    "Paris is the capital of France; Berlin is the capital of Germany.",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))",
    "Numbers 0123456789 and punctuation: ,.;:!?()[]{}",
    "Lanes interleave prefill steps with drafter proposals and target verification.",
]

# Tiny shapes; GQA everywhere (4 query heads over 2 KV heads).
_BASE = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-5,
    initializer_range=0.25,  # peaked logits, so greedy argmax is far from ties
    bos_token_id=None,
    eos_token_id=0,
)
ARCHS = {
    "llama": ("LlamaConfig", {"rope_theta": 10000.0}),
    "llama3-rope": (
        "LlamaConfig",
        {
            "rope_theta": 500000.0,
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        },
    ),
    "smollm2": ("LlamaConfig", {"tie_word_embeddings": True, "rope_theta": 100000.0}),
    "mistral": ("MistralConfig", {"sliding_window": None, "head_dim": 16}),
    "qwen2": ("Qwen2Config", {"tie_word_embeddings": True}),
    "qwen3": ("Qwen3Config", {"head_dim": 32, "attention_bias": False}),
    # Qwen3-MoE: layer 0 routes to 2 of 8 experts, layer 1 keeps a dense MLP
    "qwen3_moe": (
        "Qwen3MoeConfig",
        {
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 48,
            "norm_topk_prob": True,
            "mlp_only_layers": [1],
        },
    ),
    # Qwen3.5 hybrid: layers 0-2 gated DeltaNet (2 key heads over 4 value heads), layer 3
    # gated attention with partial RoPE (a quarter of head_dim). Smaller weights: at 0.25 the
    # recurrent state grows until transformers' chunked prefill and lanes' recurrence (both
    # float32) differ by ~7e-4 over 120 tokens, each ~3-8e-4 from a float64 run
    "qwen3_5": (
        "Qwen3_5TextConfig",
        {
            "initializer_range": 0.1,
            "num_hidden_layers": 4,
            "head_dim": 16,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 16,
            "linear_value_head_dim": 16,
        },
    ),
}
ARCHS["qwen3_5_moe"] = (  # the same hybrid, every MLP routed (2 of 8 experts) + a shared one
    "Qwen3_5MoeTextConfig",
    {
        **ARCHS["qwen3_5"][1],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 64,  # multiples of 64: the Triton matmul's K tile (GPU test)
        "shared_expert_intermediate_size": 64,
    },
)
# GLM-4 MoE: layer 0 dense, layer 1 routes to 2 of 8 experts in 2 groups (1 group competes),
# sigmoid scores with a correction bias (perturbed below), an ungated shared expert, partial RoPE
# (half of head_dim), q/k norms and qkv bias
ARCHS["glm4_moe"] = (
    "Glm4MoeConfig",
    {
        "head_dim": 16,
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "n_group": 2,
        "topk_group": 1,
        "moe_intermediate_size": 64,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "routed_scaling_factor": 2.5,
        "norm_topk_prob": True,
        "use_qk_norm": True,
        "attention_bias": True,
    },
)
# Nemotron-H: blocks of one mixer each: Mamba-2 (4 heads of 16 in 2 groups, state 8), an MLP,
# attention without RoPE, an MLP, Mamba-2, an MLP
ARCHS["nemotron_h"] = (
    "NemotronHConfig",
    {
        "initializer_range": 0.1,
        "head_dim": 16,
        "layers_block_type": ["mamba", "mlp", "attention", "mlp", "mamba", "mlp"],
        "num_hidden_layers": 6,
        "mamba_num_heads": 4,
        "mamba_head_dim": 16,
        "ssm_state_size": 8,
        "n_groups": 2,
        "conv_kernel": 4,
        "chunk_size": 8,
        "layer_norm_epsilon": 1e-5,
    },
)
# Zero-centred norms (stored w, applied 1 + w) start at w = 0: perturbed, so the offset is tested;
# Nemotron-H's norms start at 1 and its Mamba-2 parameters at fixed values (A = 1..heads, D = 1,
# dt_bias = 1): perturbed, so a weight read from the wrong place shows
_PERTURB_NORMS = {"qwen3_5", "qwen3_5_moe", "nemotron_h"}
_PERTURB_MIXER = {"nemotron_h": ("A_log", ".D", "dt_bias")}
_MODEL_CLASSES = {
    "LlamaConfig": "LlamaForCausalLM",
    "MistralConfig": "MistralForCausalLM",
    "Qwen2Config": "Qwen2ForCausalLM",
    "Qwen3Config": "Qwen3ForCausalLM",
    "Qwen3MoeConfig": "Qwen3MoeForCausalLM",
    "Qwen3_5TextConfig": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeTextConfig": "Qwen3_5MoeForCausalLM",
    "Glm4MoeConfig": "Glm4MoeForCausalLM",
    "NemotronHConfig": "NemotronHForCausalLM",
}


def matches_transformers_over_chunks(path: Path, hf, text: str, max_tokens: int) -> None:
    """A long prompt in 16-token prefill chunks: greedy tokens equal transformers' generate,
    then logits over prompt + output within 1e-4 of its forward."""
    from lanes import EngineConfig, SamplingParams, build_engine

    engine = build_engine(str(path), EngineConfig(prefill_chunk=16, max_tokens_per_round=16))
    ids = engine.tokenizer.encode(text)
    assert len(ids) > 64
    (out,) = engine.generate([ids], SamplingParams(max_tokens=max_tokens, ignore_eos=True))
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        ref = hf.generate(
            torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False, pad_token_id=0
        )
        theirs = hf(torch.tensor([ids + out.token_ids])).logits[0].float()
    assert out.token_ids == ref[0, len(ids) :].tolist()
    (ours,) = engine.prompt_logits([ids + out.token_ids])
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    engine.check_integrity()


def train_tokenizer(vocab_size: int = 384):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(CORPUS, trainer)
    return tk


def write_tiny_model(root: Path, arch: str, seed: int = 0, **overrides):
    """Write a tiny HF checkpoint (config.json, model.safetensors, tokenizer files); return the
    transformers model that wrote it, in eval mode."""
    import transformers

    config_name, extra = ARCHS[arch]
    tk = train_tokenizer()
    shape = {**_BASE, **extra, **overrides}
    config = getattr(transformers, config_name)(vocab_size=tk.get_vocab_size(), **shape)
    torch.manual_seed(seed)
    model = getattr(transformers, _MODEL_CLASSES[config_name])(config).eval()
    if arch in _PERTURB_NORMS:
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "norm" in name or name.endswith(_PERTURB_MIXER.get(arch, ())):
                    p.add_(torch.randn_like(p) * 0.2)
    with torch.no_grad():  # a zero correction bias would leave its path untested
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.add_(torch.randn_like(b) * 0.3)
    root.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(root, safe_serialization=True)
    tk.save(str(root / "tokenizer.json"))
    (root / "tokenizer_config.json").write_text(
        json.dumps({"chat_template": CHATML, "eos_token": "<|endoftext|>", "bos_token": None})
    )
    return model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, tuple[Path, object]]:
    """arch -> (checkpoint dir, transformers model) for every architecture."""
    root = tmp_path_factory.mktemp("tiny")
    return {arch: (root / arch, write_tiny_model(root / arch, arch)) for arch in ARCHS}


@pytest.fixture(scope="session")
def llama_dir(tiny_models) -> Path:
    return tiny_models["llama"][0]


@pytest.fixture(scope="session")
def long_model_dir(tmp_path_factory) -> Path:
    """The tiny llama with a 4K context, for prompts long enough to cancel mid-prefill."""
    path = tmp_path_factory.mktemp("long") / "llama"
    write_tiny_model(path, "llama", max_position_embeddings=4096)
    return path


@pytest.fixture(scope="module")
def long_model_server(long_model_dir):
    """A live server on that model (tests/test_server.py, test_server_outputs.py)."""
    from lanes import EngineConfig, build_engine
    from tests.live_server import LiveServer

    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16, max_lanes=32))
    with LiveServer(engine, report_cached_tokens=True) as live:
        yield live
