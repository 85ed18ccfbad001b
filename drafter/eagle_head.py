"""The trainable EAGLE-style head of `lanes distill` (drafter/distill.py) and its loss: the
"training-time test" unrolls the head `depth` passes over a sequence, pass d reading its own
guesses of pass d - 1, as it drafts at step d. Tensor names are those drafter/eagle.py loads."""

from __future__ import annotations

import random

import torch
import torch.nn.functional as F

from lanes.config import ModelConfig
from lanes.drafter.eagle import FUSE, REDUCE, VOCAB
from lanes.drafter.teacher import Example
from lanes.models import Checkpoint
from lanes.models.rope import rope_tables

TOP_K = 8  # teacher probabilities kept per position
FEATURE_LOSS_WEIGHT = 0.2


class EagleHead(torch.nn.Module):
    """The trainable drafter; tensor names as drafter/eagle.py loads them."""

    def __init__(
        self,
        cfg: ModelConfig,
        target: Checkpoint,
        vocab: torch.Tensor,
        device: str,
        feature_layers: tuple[int, ...] | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        embed = target.load("model.embed_tokens.weight").float().to(device)
        self.register_buffer("embed", embed, persistent=False)
        self.register_buffer("vocab", vocab.to(device), persistent=False)
        last = target.config.num_layers - 1
        self.params = torch.nn.ParameterDict()
        for name in [k for k in target.shapes if k.startswith(f"model.layers.{last}.")]:
            own = name.replace(f"layers.{last}.", "layers.0.")
            self.params[_key(own)] = torch.nn.Parameter(target.load(name).float().to(device))
        norm = target.load("model.norm.weight").float().to(device)
        self.params[_key("model.norm.weight")] = torch.nn.Parameter(norm)
        # start as "embedding + feature": the layer then learns the step from there
        eye = torch.eye(h, device=device)
        self.params[_key(FUSE)] = torch.nn.Parameter(torch.cat([eye, eye], dim=1))
        self.feature_layers = feature_layers
        if feature_layers is not None:  # several target layers: `reduce` maps them to one width,
            # starting as "the final layer's feature" (what a single-layer head reads)
            start = torch.zeros(h, h * len(feature_layers), device=device)
            start[:, -h:] = eye
            self.params[_key(REDUCE)] = torch.nn.Parameter(start)
        cos, sin = rope_tables(cfg, device)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def p(self, name: str) -> torch.Tensor:
        return self.params[_key(name)]

    def tensors(self) -> dict[str, torch.Tensor]:
        out = {
            k.replace("__", "."): v.detach().to(torch.bfloat16).cpu()
            for k, v in self.params.items()
        }
        out[VOCAB] = self.vocab.cpu()
        return out

    def _norm(self, x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.cfg.rms_norm_eps))

    def _rope(self, v, t):  # v [B, H, T, D]
        cos, sin = self.cos[:t], self.sin[:t]
        half = v.shape[-1] // 2
        v1, v2 = v[..., :half], v[..., half:]
        return torch.cat([v1 * cos - v2 * sin, v2 * cos + v1 * sin], dim=-1)

    def unrolled(self, ids: torch.Tensor, features: torch.Tensor, depth: int) -> list[torch.Tensor]:
        """ids [B, T], features [B, T, h] -> per pass, guesses [B, T - 1, h] (row r: the
        feature at r + 1)."""
        cfg, p = self.cfg, "model.layers.0."
        b, t = ids.shape
        rows = t - 1
        tok = self.embed[ids[:, 1:]]
        feat = features[:, :rows].float()
        if self.feature_layers is not None:
            feat = feat @ self.p(REDUCE).T
        group = cfg.num_heads // cfg.num_kv_heads
        passes_kv: list[tuple[torch.Tensor, torch.Tensor]] = []
        guesses = []
        for _ in range(depth):
            x = torch.cat([tok, feat], dim=-1) @ self.p(FUSE).T
            y = self._norm(x, self.p(p + "input_layernorm.weight"))

            def heads(w, n, y=y):
                return (y @ self.p(p + w).T).view(b, rows, n, -1).transpose(1, 2)

            q = self._rope(heads("self_attn.q_proj.weight", cfg.num_heads), rows)
            k = self._rope(heads("self_attn.k_proj.weight", cfg.num_kv_heads), rows)
            v = heads("self_attn.v_proj.weight", cfg.num_kv_heads)
            passes_kv.append((k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)))
            a = _chain_attention(q, passes_kv)
            x = x + a.transpose(1, 2).reshape(b, rows, -1) @ self.p(p + "self_attn.o_proj.weight").T
            y = self._norm(x, self.p(p + "post_attention_layernorm.weight"))
            g = F.silu(y @ self.p(p + "mlp.gate_proj.weight").T) * (
                y @ self.p(p + "mlp.up_proj.weight").T
            )
            x = x + g @ self.p(p + "mlp.down_proj.weight").T
            guess = self._norm(x, self.p("model.norm.weight"))
            guesses.append(guess)
            # the next pass reads, at row r, this pass's guess from row r - 1
            feat = torch.cat([guess.new_zeros(b, 1, guess.shape[-1]), guess[:, :-1]], dim=1)
        return guesses


def _chain_attention(q: torch.Tensor, passes_kv: list) -> torch.Tensor:
    """Pass d (0-based, = len(passes_kv) - 1) at row r attends to pass-0 keys j <= r - d and to
    pass-e keys at row r - d + e for e = 1..d (its own draft chain). q [B, H, R, D]."""
    d = len(passes_kv) - 1
    rows = q.shape[2]
    scale = q.shape[-1] ** -0.5
    k0, v0 = passes_kv[0]
    s0 = (q @ k0.transpose(-1, -2)).float() * scale  # [B, H, R, R]
    r = torch.arange(rows, device=q.device)
    s0 = s0.masked_fill(r[None, :] > (r[:, None] - d), float("-inf"))
    diag_s, diag_v = [], []
    for e in range(1, d + 1):
        ke, ve = passes_kv[e]
        shift = d - e  # key row r - shift
        ks = torch.cat(
            [ke.new_zeros(*ke.shape[:2], shift, ke.shape[-1]), ke[:, :, : rows - shift]], 2
        )
        vs = torch.cat(
            [ve.new_zeros(*ve.shape[:2], shift, ve.shape[-1]), ve[:, :, : rows - shift]], 2
        )
        s = (q * ks).sum(-1, keepdim=True).float() * scale
        diag_s.append(s.masked_fill((r < shift)[None, None, :, None], float("-inf")))
        diag_v.append(vs)
    probs = torch.softmax(torch.cat([s0, *diag_s], dim=-1), dim=-1).to(q.dtype)
    out = probs[..., :rows] @ v0
    for i, vs in enumerate(diag_v):
        out = out + probs[..., rows + i : rows + i + 1] * vs
    return out


def _key(name: str) -> str:
    return name.replace(".", "__")


def batch_loss(
    head: EagleHead, examples: list[Example], depth: int, max_len: int, rng: random.Random
) -> tuple[torch.Tensor, list[float]]:
    """Mean loss over the passes; and each pass's top-1 agreement with the target."""
    windows = []
    for ex in examples:
        n = len(ex.ids)
        start = rng.randrange(0, n - max_len + 1) if n > max_len else 0
        windows.append((ex, start, min(n, start + max_len)))
    t = max(end - start for _, start, end in windows)
    dev = head.embed.device
    b = len(windows)
    ids = torch.zeros((b, t), dtype=torch.long, device=dev)
    feats = torch.zeros((b, t, windows[0][0].features.shape[-1]), device=dev)
    top_ids = torch.zeros((b, t, TOP_K), dtype=torch.long, device=dev)
    top_lp = torch.zeros((b, t, TOP_K), device=dev)  # padding rows: masked out below
    valid = torch.zeros((b, t), dtype=torch.bool, device=dev)
    for i, (ex, start, end) in enumerate(windows):
        n = end - start
        ids[i, :n] = ex.ids[start:end]
        feats[i, :n] = ex.features[start:end].float()
        top_ids[i, :n] = ex.top_ids[start:end]
        top_lp[i, :n] = ex.top_logprobs[start:end]
        valid[i, :n] = True
    # row r predicts position r + 2, from the target's distribution at r + 1
    lab_ids, lab_lp, lab_valid = top_ids[:, 1:], top_lp[:, 1:], valid[:, 1:]
    next_feat = feats[:, 1:, -head.cfg.hidden_size :]  # the final layer's feature
    index = torch.full((head.cfg.vocab_size,), -1, dtype=torch.long, device=dev)
    index[head.vocab] = torch.arange(len(head.vocab), device=dev)
    lab_sub = index[lab_ids]  # position of each teacher token in the draft vocab, -1 if absent
    weights = torch.softmax(lab_lp, dim=-1) * (lab_sub >= 0)
    weights = weights / weights.sum(-1, keepdim=True).clamp_min(1e-9)
    lm_head = head.embed[head.vocab]
    losses, agree = [], []
    for d, guess in enumerate(head.unrolled(ids, feats, depth)):
        rows_ok = lab_valid.clone()
        rows_ok[:, :d] = False  # a pass-d chain needs d earlier rows
        logp = torch.log_softmax((guess @ lm_head.T).float(), dim=-1)
        ce = -(logp.gather(-1, lab_sub.clamp_min(0)) * weights).sum(-1)
        feat_l1 = F.smooth_l1_loss(guess, next_feat, reduction="none").mean(-1)
        n = rows_ok.sum().clamp_min(1)
        per_row = torch.where(rows_ok, ce + FEATURE_LOSS_WEIGHT * feat_l1, 0.0)
        losses.append(per_row.sum() / n)
        hit = head.vocab[logp.argmax(-1)] == lab_ids[..., 0]
        agree.append(float((hit & rows_ok).sum() / n))
    return torch.stack(losses).mean(), agree
