"""SentencePiece GGUF tokenizers ('llama' in tokenizer.ggml.model: Llama 2, Mistral, ... as
llama.cpp's converter writes them): lanes' rebuild encodes and decodes as transformers' GGUF
tokenizer loader does (the oracle), on a vocabulary trained here with byte fallback."""

from __future__ import annotations

import pytest
from tokenizers import SentencePieceBPETokenizer

from lanes.tokenizer import Tokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Speculative decoding drafts tokens; the target verifies them in one forward.",
    "Prices rose 3.5% in 2024, then fell: 1,234 units sold.",
    "  leading spaces, trailing spaces  ",
    "Ünïcödé and emoji 🚀 fall back to bytes, as do 漢字.",
    "line one\nline two\n\n\ttabbed",
]
CONTROL, NORMAL, UNKNOWN, BYTE = 3, 1, 2, 6


def sentencepiece_fields(add_space_prefix: bool = True) -> dict:
    """A llama.cpp-style SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte pieces, then
    pieces in merge order with falling scores."""
    trained = SentencePieceBPETokenizer()
    trained.train_from_iterator(TEXTS * 20, vocab_size=300, min_frequency=1, show_progress=False)
    pieces = sorted(trained.get_vocab().items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for rank, (piece, _) in enumerate(pieces):
        if piece not in tokens:
            tokens.append(piece)
            types.append(NORMAL)
            scores.append(-float(rank))
    return {
        "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores, "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_space_prefix": add_space_prefix,
    }  # fmt: skip


def write_tokenizer_gguf(path, fields: dict) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(fields["tokenizer.ggml.tokens"])
    w.add_token_scores(fields["tokenizer.ggml.scores"])
    w.add_token_types(fields["tokenizer.ggml.token_type"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_space_prefix(fields["tokenizer.ggml.add_space_prefix"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def oracle(tmp_path_factory):
    import transformers

    fields = sentencepiece_fields()
    folder = tmp_path_factory.mktemp("spm")
    write_tokenizer_gguf(folder / "tok.gguf", fields)
    theirs = transformers.AutoTokenizer.from_pretrained(str(folder), gguf_file="tok.gguf")
    return Tokenizer.from_gguf_fields(fields), theirs


@pytest.mark.parametrize("text", TEXTS)
def test_encodes_and_decodes_as_transformers_gguf_loader(oracle, text):
    ours, theirs = oracle
    ids = ours.encode(text)
    assert ids == theirs.encode(text)
    assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)
    assert ids[0] == 1  # add_bos_token


def test_unknown_characters_fall_back_to_bytes(oracle):
    ours, _ = oracle
    ids = ours.encode("♞", add_special_tokens=False)  # in no trained piece
    pieces = [ours.tk.id_to_token(i) for i in ids]
    assert "<0xE2>" in pieces and ours.decode(ids) == "♞"


def test_negative_control_merges_in_vocabulary_order_differ(oracle):
    """The merges' order is the tokenization: ranked by vocabulary index instead of score, some
    text splits differently (so the equality above checks the ranking)."""
    from tokenizers import models

    ours, theirs = oracle
    fields = sentencepiece_fields()
    reversed_scores = dict(
        fields, **{"tokenizer.ggml.scores": [-s for s in fields["tokenizer.ggml.scores"]]}
    )
    wrong = Tokenizer.from_gguf_fields(reversed_scores)
    assert isinstance(wrong.tk.model, models.BPE)
    assert any(wrong.encode(t) != theirs.encode(t) for t in TEXTS)
