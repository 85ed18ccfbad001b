"""The Llama-family decoder (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) over a flat paged batch."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from cache.kv_pool import KVPool
from lanes.batch import ForwardBatch
from lanes.config import ModelConfig
from lanes.models.rope import rope_tables
from lanes.models.weights import DecoderWeights
from lanes.ops import Ops


class Decoder:
    """Runs one forward: embeds the batch's tokens, writes their K/V into the pool, attends over
    each lane's whole context, and returns logits for the rows in `batch.logits_indices`."""

    def __init__(self, cfg: ModelConfig, weights: DecoderWeights, ops: Ops) -> None:
        self.cfg = cfg
        self.weights = weights
        self.ops = ops
        self.cos, self.sin = rope_tables(cfg, weights.embed.device)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv: KVPool) -> torch.Tensor:
        cfg, ops, w = self.cfg, self.ops, self.weights
        n, d = batch.num_tokens, cfg.head_dim
        cos, sin = self.cos[batch.positions], self.sin[batch.positions]  # [n, head_dim / 2]
        h = w.embed[batch.input_ids]  # [n, hidden]
        for i, layer in enumerate(w.layers):
            x = ops.rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            qkv = ops.linear(x, layer.qkv, layer.qkv_bias)  # [n, q_size + 2 * kv_size]
            q, k, v = qkv.split([cfg.q_size, cfg.kv_size, cfg.kv_size], dim=-1)
            q = q.reshape(n, cfg.num_heads, d)
            k = k.reshape(n, cfg.num_kv_heads, d)
            v = v.reshape(n, cfg.num_kv_heads, d)
            if cfg.qk_norm:
                q = ops.rms_norm(q.reshape(-1, d), layer.q_norm, cfg.rms_norm_eps).view(q.shape)
                k = ops.rms_norm(k.reshape(-1, d), layer.k_norm, cfg.rms_norm_eps).view(k.shape)
            q, k = ops.rope(q, cos, sin), ops.rope(k, cos, sin)
            kv.write(i, batch.slot_mapping, k, v)
            attn = ops.attention(q, kv.k[i], kv.v[i], batch)  # [n, num_heads, head_dim]
            h = h + ops.linear(attn.reshape(n, cfg.q_size), layer.o)
            x = ops.rms_norm(h, layer.post_norm, cfg.rms_norm_eps)
            gate, up = ops.linear(x, layer.gate_up).chunk(2, dim=-1)
            h = h + ops.linear(F.silu(gate) * up, layer.down)
        x = ops.rms_norm(h[batch.logits_indices], w.norm, cfg.rms_norm_eps)
        return ops.linear(x, w.lm_head).float()  # [num_logits, vocab]
