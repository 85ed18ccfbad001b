"""The teacher of `lanes distill`: the target run as one dense, padded batch of sequences.

Training data needs many answers, not served ones: no paging, no prompt cache, no per-lane
sampling. Here a whole batch of prompts (left-padded) decodes together, one token per row per
step over a dense KV cache, with torch's SDPA; then `score` runs padded prefills over prompt +
answer for the target's final-norm features and its top next-token distributions. The weights
and the layer arithmetic are the target's (lanes.models.assemble); only the batching differs
from serving, so the numbers match serving up to float rounding, which is all training needs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from lanes.models import Checkpoint, assemble
from lanes.models.rope import rope_tables
from lanes.ops import rms_norm


@dataclass
class Example:
    """One training sequence, scored by the target."""

    ids: torch.Tensor  # [T] int64
    features: torch.Tensor  # [T, hidden]: the final-norm rows the LM head reads
    top_ids: torch.Tensor  # [T, k] int32: the most likely next tokens at each position
    top_logprobs: torch.Tensor  # [T, k] float32


class DenseTarget:
    def __init__(self, checkpoint: Checkpoint, device: str, dtype: torch.dtype) -> None:
        self.cfg = checkpoint.config
        self.device = device
        self.w = assemble(self.cfg, checkpoint.load, dtype, device)
        self.cos, self.sin = rope_tables(self.cfg, device)
        self.eos = sorted(set(self.cfg.eos_token_ids) | set(checkpoint.tokenizer.eos_token_ids))

    def _rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x [B, H, T, D], pos [B, T]; rotate-half layout like lanes.ops."""
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        half = x.shape[-1] // 2
        xf = x.float()
        x1, x2 = xf[..., :half], xf[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.cfg.rms_norm_eps)

    @torch.inference_mode()
    def forward(
        self,
        ids: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        cache: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        at: int = 0,
        layers: tuple[int, ...] | None = None,
    ) -> torch.Tensor:
        """ids, pos [B, T] -> final-norm rows [B, T, hidden], or with `layers` the normed
        outputs of those layers side by side (as lanes.models.decoder). With `cache` (per layer k, v
        [B, HKV, S, D]) the new K/V go to columns [at, at + T) and attention reads columns
        [0, at + T) under `mask` [B, 1, T, at + T] (True: attend); without it, attention is
        causal over the T rows (right padding needs no mask)."""
        cfg, w = self.cfg, self.w
        b, t = ids.shape
        d = cfg.head_dim
        x = w.embed[ids]
        h = self._norm(x, w.layers[0].input_norm)
        kept = []
        for i, layer in enumerate(w.layers):
            qkv = F.linear(h, layer.qkv, layer.qkv_bias)
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = q.view(b, t, cfg.num_heads, d).transpose(1, 2)
            k = k.view(b, t, cfg.num_kv_heads, d).transpose(1, 2)
            v = v.view(b, t, cfg.num_kv_heads, d).transpose(1, 2)
            if cfg.qk_norm:
                q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
            q, k = self._rope(q, pos), self._rope(k, pos)
            if cache is not None:
                kc, vc = cache[i]
                kc[:, :, at : at + t], vc[:, :, at : at + t] = k, v
                k, v = kc[:, :, : at + t], vc[:, :, : at + t]
            if t == 1 and mask is not None:
                # one query per row: the query heads sharing a K/V head become that head's
                # query rows, so attention needs no K/V copies per query head (GQA)
                group = cfg.num_heads // cfg.num_kv_heads
                a = F.scaled_dot_product_attention(
                    q.reshape(b, cfg.num_kv_heads, group, d), k, v, attn_mask=mask
                ).reshape(b, cfg.num_heads, 1, d)
            else:
                a = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, is_causal=mask is None, enable_gqa=True
                )
            x = x + F.linear(a.transpose(1, 2).reshape(b, t, cfg.q_size), layer.o)
            h = self._norm(x, layer.post_norm)
            gate, up = F.linear(h, layer.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down)
            h = self._norm(x, w.layers[i + 1].input_norm if i + 1 < len(w.layers) else w.norm)
            if layers is not None and i in layers:
                kept.append(h)
        return torch.cat(kept, dim=-1) if kept else h

    @torch.inference_mode()
    def generate(
        self,
        prompts: list[list[int]],
        new_tokens: int,
        temperatures: list[float],
        generator: torch.Generator | None = None,
    ) -> list[list[int]]:
        """Each prompt followed by the target's answer: up to `new_tokens` tokens, ending at (and
        keeping) the first end-of-sequence token; greedy where the temperature is 0."""
        cfg, dev = self.cfg, self.device
        b, p = len(prompts), max(map(len, prompts))
        pad = torch.tensor([p - len(x) for x in prompts], device=dev)
        ids = torch.tensor([[0] * (p - len(x)) + x for x in prompts], device=dev)
        cols = torch.arange(p + new_tokens, device=dev)
        live = cols[None] >= pad[:, None]  # [B, S]: the columns that hold real tokens
        shape = (b, cfg.num_kv_heads, p + new_tokens, cfg.head_dim)
        cache = [
            (self.w.embed.new_empty(shape), self.w.embed.new_empty(shape))
            for _ in range(cfg.num_layers)
        ]
        causal = cols[:p, None] >= cols[None, :p]
        # a padding row sees only itself (a row that sees nothing would give NaN)
        mask = (causal & live[:, None, :p]) | torch.eye(p, dtype=torch.bool, device=dev)
        hidden = self.forward(
            ids, (cols[:p][None] - pad[:, None]).clamp_min(0), mask[:, None], cache
        )
        temps = torch.tensor(temperatures, device=dev, dtype=torch.float32)[:, None]
        eos = torch.tensor(self.eos, device=dev)
        out = torch.zeros((b, new_tokens), dtype=torch.int64, device=dev)
        ended = torch.zeros(b, dtype=torch.bool, device=dev)
        last = hidden[:, -1]
        for step in range(new_tokens):
            logits = F.linear(last, self.w.lm_head).float()
            greedy = logits.argmax(-1)
            probs = torch.softmax(logits / temps.clamp_min(1e-5), dim=-1)
            sampled = torch.multinomial(probs, 1, generator=generator)[:, 0]
            token = torch.where(temps[:, 0] > 0, sampled, greedy)
            out[:, step] = token
            ended |= torch.isin(token, eos)
            if step + 1 == new_tokens or bool(ended.all()):
                break
            at = p + step
            pos = (at - pad)[:, None]
            last = self.forward(token[:, None], pos, live[:, None, None, : at + 1], cache, at)[:, 0]
        answers = []
        for prompt, row in zip(prompts, out.tolist(), strict=True):
            row = row[: step + 1]
            stop = next((i for i, t in enumerate(row) if t in self.eos), None)
            answers.append(prompt + (row if stop is None else row[: stop + 1]))
        return answers

    @torch.inference_mode()
    def score(
        self,
        seqs: list[list[int]],
        top_k: int,
        max_tokens: int = 4096,
        layers: tuple[int, ...] | None = None,
    ) -> list[Example]:
        """Features (of `layers`, see forward) and top-k next-token log-probabilities at every
        position of every sequence, in order; sequences of similar length share a right-padded
        forward of <= max_tokens rows."""
        order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
        done: dict[int, Example] = {}
        start = 0
        while start < len(order):
            end = start + 1
            while end < len(order) and (end - start + 1) * len(seqs[order[end]]) <= max_tokens:
                end += 1
            group = [seqs[i] for i in order[start:end]]
            t = len(group[-1])
            ids = torch.tensor([s + [0] * (t - len(s)) for s in group], device=self.device)
            pos = torch.arange(t, device=self.device).expand(len(group), t)
            hidden = self.forward(ids, pos, None, layers=layers)
            final = hidden[..., -self.cfg.hidden_size :]  # the LM head reads the last layer's
            logp = torch.log_softmax(F.linear(final, self.w.lm_head).float(), dim=-1)
            top = logp.topk(top_k, dim=-1)
            for row, i in enumerate(order[start:end]):
                n = len(seqs[i])
                done[i] = Example(
                    ids[row, :n].clone(),
                    hidden[row, :n].clone(),
                    top.indices[row, :n].to(torch.int32),
                    top.values[row, :n].clone(),
                )
            start = end
        return [done[i] for i in range(len(seqs))]
