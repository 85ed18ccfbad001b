"""Tokenizers: from an HF `tokenizer.json`, or rebuilt from GGUF metadata; plus the chat template."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as HFTokenizer

from lanes.chat import render_chat
from lanes.config import ConfigError

if TYPE_CHECKING:
    from lanes.config import ModelConfig

# GGUF `tokenizer.ggml.pre` -> (a split regex applied first or None, then GPT-2's own split?).
_GGUF_PRE_SPLITS: dict[str, tuple[str | None, bool]] = {
    "default": (None, True),
    "gpt2": (None, True),
    "smollm": (r"\p{N}", True),  # digits one by one, then GPT-2's split
    "llama-bpe": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        False,
    ),
    "qwen2": (
        r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
        r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
        False,
    ),
}
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


class Tokenizer:
    def __init__(
        self,
        tk: HFTokenizer,
        *,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        eos_token_ids: set[int],
    ) -> None:
        self.tk = tk
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_token_ids = frozenset(eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return self.tk.get_vocab_size(with_added_tokens=True)

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters one token stands for: its longest vocabulary entry (byte-level
        entries spell one character per byte, at least the characters they decode to)."""
        vocab = self.tk.get_vocab(with_added_tokens=True)
        return max((len(t) for t in vocab), default=1)

    def to_json(self) -> str:
        """The tokenizer as HF `tokenizers` JSON (what the grammar engine reads)."""
        return self.tk.to_str()

    @property
    def control_tokens(self) -> list[str]:
        """The strings the tokenizer turns into special (control) tokens wherever they appear."""
        added = self.tk.get_added_tokens_decoder().values()
        return sorted({t.content for t in added if t.special and t.content})

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.tk.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.tk.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(
        self,
        messages: list[dict],
        add_generation_prompt: bool = True,
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> str:
        return render_chat(
            self.chat_template,
            messages,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            template_kwargs=template_kwargs,
        )

    def encode_chat(
        self,
        messages: list[dict],
        tools: list[dict] | None = None,
        template_kwargs: dict | None = None,
    ) -> list[int]:
        # The rendered template already holds its special tokens (BOS included, where it has one).
        text = self.apply_chat_template(messages, tools=tools, template_kwargs=template_kwargs)
        return self.encode(text, add_special_tokens=False)

    def save(self, directory: Path) -> list[Path]:
        """Write tokenizer.json and tokenizer_config.json (chat template, BOS/EOS) as an HF
        tokenizer directory: what benchmark clients and `AutoTokenizer` read, also for models
        whose tokenizer lives inside a GGUF file. Returns the files written."""
        directory.mkdir(parents=True, exist_ok=True)
        model_file, config_file = directory / "tokenizer.json", directory / "tokenizer_config.json"
        self.tk.save(str(model_file))
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "chat_template": self.chat_template,
        }
        config_file.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
        return [model_file, config_file]

    @classmethod
    def from_hf_dir(cls, path: Path, config: ModelConfig) -> Tokenizer:
        file = path / "tokenizer.json"
        if not file.is_file():
            raise ConfigError(f"{path} has no tokenizer.json")
        tk = HFTokenizer.from_file(str(file))
        tok_cfg = _read_json(path / "tokenizer_config.json")
        template = tok_cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():
            template = jinja_file.read_text()
        bos, eos = _token_str(tok_cfg.get("bos_token")), _token_str(tok_cfg.get("eos_token"))
        eos_ids = set(config.eos_token_ids)
        gen_eos = _read_json(path / "generation_config.json").get("eos_token_id")
        eos_ids.update(
            gen_eos if isinstance(gen_eos, list) else [] if gen_eos is None else [gen_eos]
        )
        if eos is not None and tk.token_to_id(eos) is not None:
            eos_ids.add(tk.token_to_id(eos))
        return cls(tk, chat_template=template, bos_token=bos, eos_token=eos, eos_token_ids=eos_ids)

    @classmethod
    def from_gguf_fields(cls, fields: dict) -> Tokenizer:
        """Rebuild the tokenizer from GGUF `tokenizer.ggml.*` metadata: byte-level BPE ('gpt2')
        or SentencePiece BPE ('llama': Llama 2, Mistral, ... GGUFs)."""
        kind = fields.get("tokenizer.ggml.model")
        if kind == "gpt2":
            tk = _byte_level_bpe(fields)
        elif kind == "llama":
            tk = _sentencepiece_bpe(fields)
        else:
            raise ConfigError(
                f"GGUF tokenizer model {kind!r} is not supported (lanes rebuilds 'gpt2' byte-level "
                "BPE and 'llama' SentencePiece BPE); load the model from an HF directory instead"
            )
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        special = [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=False)
            if ty in (_GGUF_CONTROL, _GGUF_USER_DEFINED)
        ]
        tk.add_special_tokens(special)

        def tok(key: str) -> str | None:
            i = fields.get(key)
            return tokens[i] if i is not None and 0 <= i < len(tokens) else None

        bos = tok("tokenizer.ggml.bos_token_id")
        if fields.get("tokenizer.ggml.add_bos_token") and bos is not None:
            bos_id = fields["tokenizer.ggml.bos_token_id"]
            tk.post_processor = processors.TemplateProcessing(
                single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)]
            )

        eos_id = fields.get("tokenizer.ggml.eos_token_id")
        eos_ids = {eos_id} if eos_id is not None else set()
        eot_id = fields.get("tokenizer.ggml.eot_token_id")
        if eot_id is not None:
            eos_ids.add(eot_id)
        return cls(
            tk,
            chat_template=fields.get("tokenizer.chat_template"),
            bos_token=bos,
            eos_token=tok("tokenizer.ggml.eos_token_id"),
            eos_token_ids=eos_ids,
        )


def _byte_level_bpe(fields: dict) -> HFTokenizer:
    pre = fields.get("tokenizer.ggml.pre", "default")
    if pre not in _GGUF_PRE_SPLITS:
        raise ConfigError(
            f"GGUF pre-tokenizer {pre!r} is not supported; known: {', '.join(_GGUF_PRE_SPLITS)}"
        )
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
    split, gpt2_split = _GGUF_PRE_SPLITS[pre]
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=gpt2_split)
    if split is None:
        tk.pre_tokenizer = byte_level
    else:
        tk.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    tk.decoder = decoders.ByteLevel()
    return tk


def _sentencepiece_bpe(fields: dict) -> HFTokenizer:
    """SentencePiece BPE from its pieces and scores: spaces are `▁`, unknown bytes fall back to
    the `<0xXX>` pieces, a piece made of two others is one merge (merges that make higher-scored
    pieces first, as SentencePiece applies them; ties: longer left, then longer right part, then
    the vocabulary's order), and a space is put before the text (`add_space_prefix`, llama.cpp's
    key; the first text only, as transformers' non-legacy Llama tokenizer does)."""
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    scores: list[float] = fields.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    ranked = []
    for piece, i in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                key = (-scores[i], -len(left), -len(right), i, vocab[left], vocab[right])
                ranked.append((key, left, right))
    ranked.sort(key=lambda r: r[0])
    merges = [(left, right) for _, left, right in ranked]
    tk = HFTokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, byte_fallback=True))
    prefix = fields.get("tokenizer.ggml.add_space_prefix", True)
    tk.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
    )
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    tk.decoder = decoders.Sequence(steps + ([decoders.Strip(" ", 1, 0)] if prefix else []))
    return tk


def _read_json(path: Path) -> dict:
    return json.loads(path.read_text()) if path.is_file() else {}


def _token_str(value) -> str | None:
    if isinstance(value, dict):  # serialized AddedToken
        return value.get("content")
    return value
