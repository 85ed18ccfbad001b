"""`lanes distill`: train a drafter for a target model on the target's own outputs.

The drafter is a short Llama-family model of the target's width that shares the target's
embedding table and LM head (tied), so it stores only its own layers and final norm. Its layers
start as copies of target layers and are trained to predict the target's greedy next token
(cross-entropy on the target's argmax) at every position of:
- chat prompts made from Python's own documentation (pydoc_data, offline, in the standard
  library), and
- the target's greedy continuations of those prompts (its own outputs).

The output directory loads as `--drafter DIR`: config.json, model.safetensors (the drafter's
own tensors only), tokenizer files, and `drafter.json` naming the tensors taken from the target.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from lanes.config import EngineConfig, ModelConfig
from lanes.models import Checkpoint, open_checkpoint
from lanes.models.rope import rope_tables
from lanes.sampling import SamplingParams

SHARED = ["model.embed_tokens.weight"]  # taken from the target at load time


def corpus_prompts(count: int, seed: int = 0, chars: int = 600) -> list[list[dict]]:
    """Chat prompts from the Python documentation topics shipped with CPython."""
    import pydoc_data.topics

    rng = random.Random(seed)
    texts = [t for t in pydoc_data.topics.topics.values() if len(t) > 400]
    asks = [
        "Summarize this:",
        "Explain this to a beginner:",
        "Continue this text:",
        "What does this describe?",
    ]
    prompts = []
    for _ in range(count):
        text = rng.choice(texts)
        start = rng.randrange(0, max(1, len(text) - chars))
        prompts.append(
            [{"role": "user", "content": f"{rng.choice(asks)}\n\n{text[start : start + chars]}"}]
        )
    return prompts


class Student(torch.nn.Module):
    """A trainable Llama stack (HF tensor names) over the target's frozen embedding."""

    def __init__(self, cfg: ModelConfig, embed: torch.Tensor) -> None:
        super().__init__()
        self.cfg = cfg
        self.register_buffer("embed", embed, persistent=False)
        h, q, kv, inter = cfg.hidden_size, cfg.q_size, cfg.kv_size, cfg.intermediate_size

        def lin(o, i):
            return torch.nn.Parameter(torch.zeros(o, i))

        self.params = torch.nn.ParameterDict()
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            for name, shape in {
                "input_layernorm.weight": (h,),
                "post_attention_layernorm.weight": (h,),
                "self_attn.q_proj.weight": (q, h),
                "self_attn.k_proj.weight": (kv, h),
                "self_attn.v_proj.weight": (kv, h),
                "self_attn.o_proj.weight": (h, q),
                "mlp.gate_proj.weight": (inter, h),
                "mlp.up_proj.weight": (inter, h),
                "mlp.down_proj.weight": (h, inter),
            }.items():
                self.params[(p + name).replace(".", "__")] = (
                    lin(*shape) if len(shape) == 2 else torch.nn.Parameter(torch.ones(shape))
                )
        self.params["model__norm__weight"] = torch.nn.Parameter(torch.ones(h))
        cos, sin = rope_tables(cfg, "cpu")
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.params[name.replace(".", "__")]

    def hf_state(self) -> dict[str, torch.Tensor]:
        return {k.replace("__", "."): v.detach() for k, v in self.params.items()}

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] -> final hidden [B, T, h] (logits = hidden @ embed.T)."""
        cfg = self.cfg
        b, t = ids.shape
        x = self.embed[ids]
        cos, sin = self.cos[:t], self.sin[:t]

        def norm(v, w):
            return w * (v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + cfg.rms_norm_eps))

        def rope(v):  # [B, H, T, D]
            half = v.shape[-1] // 2
            v1, v2 = v[..., :half], v[..., half:]
            return torch.cat([v1 * cos - v2 * sin, v2 * cos + v1 * sin], dim=-1)

        for i in range(cfg.num_layers):
            pre = f"model.layers.{i}."
            y = norm(x, self.p(pre + "input_layernorm.weight"))
            q = (
                (y @ self.p(pre + "self_attn.q_proj.weight").T)
                .view(b, t, cfg.num_heads, -1)
                .transpose(1, 2)
            )
            k = (
                (y @ self.p(pre + "self_attn.k_proj.weight").T)
                .view(b, t, cfg.num_kv_heads, -1)
                .transpose(1, 2)
            )
            v = (
                (y @ self.p(pre + "self_attn.v_proj.weight").T)
                .view(b, t, cfg.num_kv_heads, -1)
                .transpose(1, 2)
            )
            group = cfg.num_heads // cfg.num_kv_heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
            a = F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
            x = x + a.transpose(1, 2).reshape(b, t, -1) @ self.p(pre + "self_attn.o_proj.weight").T
            y = norm(x, self.p(pre + "post_attention_layernorm.weight"))
            g = F.silu(y @ self.p(pre + "mlp.gate_proj.weight").T) * (
                y @ self.p(pre + "mlp.up_proj.weight").T
            )
            x = x + g @ self.p(pre + "mlp.down_proj.weight").T
        return norm(x, self.p("model.norm.weight"))


def teacher_data(
    target: Checkpoint, prompts, new_tokens: int, config: EngineConfig, log
) -> list[tuple[list[int], list[int]]]:
    """(token ids, the target's greedy next token at each position) for prompt + continuation."""
    from lanes import Engine

    engine = Engine(checkpoint=target, config=config)
    data = []
    for i in range(0, len(prompts), 16):
        outs = engine.generate(prompts[i : i + 16], SamplingParams(max_tokens=new_tokens))
        seqs = [o.prompt_ids + o.token_ids for o in outs]
        for seq, logits in zip(seqs, engine.prompt_logits(seqs), strict=True):
            data.append((seq, logits.argmax(dim=-1).tolist()))
        log(f"teacher data: {len(data)}/{len(prompts)} sequences")
    return data


def distill(
    target_spec: str | None,
    out: Path,
    *,
    layers: tuple[int, ...] = (0, 29),
    loss_positions: int = 256,
    num_prompts: int = 256,
    new_tokens: int = 64,
    steps: int = 400,
    batch: int = 8,
    lr: float = 1e-3,
    device: str = "cpu",
    seed: int = 0,
    snippet_chars: int = 600,
    log=print,
) -> dict:
    torch.manual_seed(seed)
    target = open_checkpoint(target_spec)
    tcfg = target.config
    if not tcfg.tie_word_embeddings:
        raise ValueError(
            "lanes distill shares the target's tied embedding; this target has an untied LM head"
        )
    scfg = replace(tcfg, num_layers=len(layers))
    started = time.perf_counter()
    prompts = corpus_prompts(num_prompts, seed, snippet_chars)
    held_out = corpus_prompts(32, seed + 1, snippet_chars)
    ecfg = EngineConfig(device=device, exact=False, prompt_cache_bytes=0)
    data = teacher_data(target, prompts, new_tokens, ecfg, log)
    test = teacher_data(target, held_out, new_tokens, ecfg, log)
    embed = target.load("model.embed_tokens.weight").float().to(device)
    student = Student(scfg, embed).to(device)
    with torch.no_grad():  # start from target layers
        for j, src in enumerate(layers):
            for name in [k for k in target.shapes if k.startswith(f"model.layers.{src}.")]:
                student.p(name.replace(f"layers.{src}.", f"layers.{j}.")).copy_(
                    target.load(name).float()
                )
        student.p("model.norm.weight").copy_(target.load("model.norm.weight").float())
    opt = torch.optim.AdamW(student.params.values(), lr=lr, weight_decay=0.0)
    losses = []
    rng = random.Random(seed)
    for step in range(steps):
        lr_now = lr * 0.5 * (1 + math.cos(math.pi * step / steps))
        for g in opt.param_groups:
            g["lr"] = lr_now
        chosen = [rng.choice(data) for _ in range(batch)]
        t = min(512, max(len(s) for s, _ in chosen))
        ids = torch.zeros((batch, t), dtype=torch.long)
        labels = torch.full((batch, t), -100, dtype=torch.long)
        for r, (s, lab) in enumerate(chosen):
            n = min(t, len(s))
            ids[r, :n] = torch.tensor(s[:n])
            labels[r, :n] = torch.tensor(lab[:n])
        hidden = student(ids.to(device))
        # a random subset of positions: the vocabulary projection dominates the cost
        where = (labels >= 0).nonzero()
        where = where[torch.randperm(len(where))[:loss_positions]]
        logits = hidden[where[:, 0], where[:, 1]] @ embed.T
        loss = F.cross_entropy(logits, labels[where[:, 0], where[:, 1]].to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == steps - 1:
            log(f"step {step}/{steps} loss {losses[-1]:.3f} lr {lr_now:.2e}")
    agreement = held_out_agreement(student, embed, test, device)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in student.hf_state().items()}
    save_file(state, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(scfg), indent=2) + "\n")
    target.tokenizer.tk.save(str(out / "tokenizer.json"))
    tok = target.tokenizer
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "bos_token": tok.bos_token,
                "eos_token": tok.eos_token,
                "chat_template": tok.chat_template,
            }
        )
        + "\n"
    )
    report = {
        "target": target.source,
        "target_fingerprint": target.fingerprint,
        "shared_with_target": SHARED,
        "layers_initialised_from": list(layers),
        "train_sequences": len(data),
        "train_tokens": sum(len(s) for s, _ in data),
        "steps": steps,
        "batch": batch,
        "seconds": round(time.perf_counter() - started, 1),
        "final_loss": losses[-1],
        "held_out_greedy_agreement": agreement,
        "losses": losses,
    }
    (out / "drafter.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_losses(losses, out / "loss.png")
    return report


@torch.no_grad()
def held_out_agreement(student: Student, embed: torch.Tensor, test, device: str) -> float:
    """Share of held-out positions where the drafter's argmax is the target's greedy token."""
    hit = total = 0
    for seq, labels in test:
        hidden = student(torch.tensor([seq], device=device))[0]
        pred = (hidden @ embed.T).argmax(dim=-1).cpu()
        hit += int((pred == torch.tensor(labels)).sum())
        total += len(labels)
    return hit / total


def hf_config(cfg: ModelConfig) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": True,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": list(cfg.eos_token_ids),
    }


def plot_losses(losses: list[float], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # plots are a bench extra
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses)
    ax.set(xlabel="step", ylabel="cross-entropy vs target greedy token", title="lanes distill")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
