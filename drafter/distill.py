"""`lanes distill`: train an EAGLE-style drafter (drafter/eagle.py) on a target's own outputs.

Data, all offline (drafter/corpus.py): chat prompts cut from Python's documentation and from
Shakespeare; the target answers each one (greedy, or sampled at temperature 0.7), as one dense
batch (drafter/teacher.py), then prefills over prompt + answer give, at every position, the
target's features (a low, a middle and the final layer, or the final-norm output alone) and its
top-k next-token distribution.

Model: `reduce` [h, 3h] maps the three layers' features to the drafter's width (absent with the
final layer alone); `fuse` [h, 2h] mixes the embedding of the token at r + 1 with the feature at r,
one Llama layer initialised from the target's last layer, the target's final norm; the LM head
is the target's own embedding (tied), restricted to the `draft_vocab` ids the target emits most.

Training ("training-time test"): the drafter runs `depth` times over the sequence. Pass 1 reads
the target's features; pass d reads, at row r, the drafter's own guess from row r - 1 of pass
d - 1, and attends to the rows it would see at draft step d: pass-1 keys up to r - d + 1, then
its own chain's keys of passes 2..d. Each pass is trained to match the target's distribution at
the row's position (soft cross-entropy over the top-k) and, lightly, its next feature.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import hashlib
import json
import math
import random
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from lanes import build_engine
from lanes.config import EngineConfig, ModelConfig
from lanes.drafter.corpus import chat_examples, pydoc_texts, shakespeare_texts
from lanes.drafter.eagle_head import TOP_K, EagleHead, batch_loss
from lanes.drafter.everyday import everyday_prompts
from lanes.drafter.teacher import DenseTarget, Example
from lanes.models import Checkpoint, open_checkpoint
from lanes.sampling import SamplingParams

SAMPLED_TEMPERATURE = 0.7


def teacher_answers(
    teacher: DenseTarget,
    prompts: list[list[int]],
    new_tokens: int,
    seed: int,
    log,
    max_seconds: float = 0.0,
    answers_file: Path | None = None,
    batch: int = 256,
    sampled_every: int = 2,
) -> list[list[int]]:
    """The target's answers (prompt + answer ids) to `prompts` (token ids), every
    `sampled_every`-th one sampled at temperature 0.7; after `max_seconds` no new batch starts.
    With `answers_file`, answers made earlier (on any machine) are read from it and new ones are
    appended to it batch by batch."""
    temps = [
        SAMPLED_TEMPERATURE if i % sampled_every == sampled_every - 1 else 0.0
        for i in range(len(prompts))
    ]
    seeds = [seed + i if t > 0 else None for i, t in enumerate(temps)]
    keys = [answer_key(p, t, s, new_tokens) for p, t, s in zip(prompts, temps, seeds, strict=True)]
    stored = read_answers(answers_file)
    todo = [i for i, key in enumerate(keys) if key not in stored]
    todo.sort(key=lambda i: len(prompts[i]))  # similar lengths share a batch: less padding
    generator = torch.Generator(teacher.device).manual_seed(seed)
    started = time.perf_counter()
    made: dict[int, list[int]] = {}
    from huggingface_hub.utils import tqdm

    bar = tqdm(total=len(todo), desc="teacher answers", unit="answer", disable=None)
    writing = answers_file is not None and todo
    with gzip.open(answers_file, "at") if writing else contextlib.nullcontext() as sink:
        for at in range(0, len(todo), batch):
            if max_seconds and time.perf_counter() - started > max_seconds:
                break
            group = todo[at : at + batch]
            answers = teacher.generate(
                [prompts[i] for i in group], new_tokens, [temps[i] for i in group], generator
            )
            for i, ids in zip(group, answers, strict=True):
                made[i] = ids
                if sink is not None:
                    sink.write(json.dumps({"key": keys[i], "ids": ids}) + "\n")
            if sink is not None:
                sink.flush()
            bar.update(len(group))
    bar.close()
    seqs = [stored.get(key, made.get(i)) for i, key in enumerate(keys)]
    seqs = [s for s in seqs if s is not None]
    new = sum(len(ids) - len(prompts[i]) for i, ids in made.items())
    log(
        f"teacher: {len(seqs)} answers ({sum(k in stored for k in keys)} read back), "
        f"{new} new tokens made in {time.perf_counter() - started:.1f} s"
    )
    return seqs


def teacher_data(
    teacher: DenseTarget, seqs: list[list[int]], log, layers: tuple[int, ...] | None = None
) -> list[Example]:
    """The target's features and top-k targets at every position of every sequence."""
    started = time.perf_counter()
    # rows of one scoring forward: its logits are [rows, vocab] float32 (6 GiB at 32K rows)
    rows = 32768 if teacher.device.startswith("cuda") else 4096
    data = teacher.score(seqs, TOP_K, rows, layers)
    log(
        f"teacher: features of {len(data)} sequences, {sum(len(ex.ids) for ex in data)} tokens "
        f"after {time.perf_counter() - started:.1f} s"
    )
    return data


def target_writer(teacher: DenseTarget, tok, batch: int, seed: int):
    """The target as drafter.everyday's writer: chats in, the target's reply texts out, in
    batches of similar prompt lengths."""
    generator = torch.Generator(teacher.device).manual_seed(seed + 1)

    def generate(chats: list[list[dict]], max_new_tokens: int, temperature: float) -> list[str]:
        ids = [tok.encode_chat(c) for c in chats]
        fits = teacher.cfg.max_position_embeddings - max_new_tokens
        order = sorted(
            (i for i in range(len(ids)) if len(ids[i]) <= fits), key=lambda i: len(ids[i])
        )
        texts = [""] * len(ids)  # a chat too long for the context gets no reply
        for at in range(0, len(order), batch):
            group = order[at : at + batch]
            made = teacher.generate(
                [ids[i] for i in group], max_new_tokens, [temperature] * len(group), generator
            )
            for i, seq in zip(group, made, strict=True):
                texts[i] = tok.decode(seq[len(ids[i]) :], skip_special_tokens=True)
        return texts

    return generate


def read_or_write_everyday(
    path: Path | None, count: int, generate, seed: int, log
) -> list[list[dict]]:
    """`count` everyday prompts: read from `path` when it holds them, else written by the target
    (and saved to `path`). A file holding fewer keeps them: only the rest are written, from a
    seed of their own (the same seed would plan the same topics again)."""
    kept: list[list[dict]] = []
    if path is not None and Path(path).is_file():
        kept = json.loads(Path(path).read_text())["prompts"]
        if len(kept) >= count:
            log(f"everyday: {count} prompts read from {path}")
            return kept[:count]
    if not count:
        return []
    started = time.perf_counter()
    more = everyday_prompts(count - len(kept), generate, seed + len(kept))
    log(
        f"everyday: {len(more)} prompts written by the target in "
        f"{time.perf_counter() - started:.1f} s, after {len(kept)} read back"
    )
    chats = kept + more
    if path is not None:
        Path(path).write_text(json.dumps({"seed": seed, "prompts": chats}) + "\n")
    return chats


def feature_layers(num_layers: int) -> tuple[int, ...]:
    """A low, a middle and the final layer (as EAGLE-3 picks them): the low layer still knows
    which token a row holds, the final one what the target will say next."""
    return tuple(sorted({min(2, num_layers // 4), num_layers // 2, num_layers - 1}))


def answer_key(prompt_ids: list[int], temperature: float, seed: int | None, max_tokens: int) -> str:
    """Names an answer slot: prompt ids and sampling parameters. (A sampled answer is one draw
    of the target at that temperature; the seed only tells the sampled slots apart.)"""
    what = [prompt_ids, float(temperature), seed, max_tokens]
    return hashlib.sha256(json.dumps(what).encode()).hexdigest()[:24]


def read_answers(path: Path | None) -> dict[str, list[int]]:
    """key -> prompt + answer ids, from a gzipped JSON-lines answers file (absent: none)."""
    if path is None or not Path(path).is_file():
        return {}
    out = {}
    with gzip.open(path, "rt") as f:
        try:
            for line in f:
                record = json.loads(line)
                out[record["key"]] = record["ids"]
        except (EOFError, gzip.BadGzipFile, json.JSONDecodeError):
            pass  # a run cut off mid-write: what came before it is good
    return out


def choose_vocab(
    data: list[Example], size: int, vocab_size: int, eos: tuple[int, ...]
) -> torch.Tensor:
    """The `size` token ids the target predicts most often (top-1), end-of-sequence included."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for ex in data:
        counts += torch.bincount(ex.top_ids[:, 0].cpu(), minlength=vocab_size).double()
    counts[list(eos)] = float("inf")
    size = min(size, vocab_size) if size > 0 else vocab_size
    return torch.sort(counts.topk(size).indices).values


def distill(
    target_spec: str | None,
    out: Path,
    *,
    num_prompts: int = 1024,
    num_answered: int = 256,
    held_out: int = 32,
    new_tokens: int = 128,
    depth: int = 3,
    steps: int = 1000,
    batch: int = 16,
    max_len: int = 512,
    lr: float = 5e-4,
    draft_vocab: int = 16384,
    device: str = "cpu",
    teacher_batch: int = 256,
    seed: int = 0,
    snippet_chars: int = 600,
    corpus: tuple[str, ...] = ("pydoc", "shakespeare"),
    max_train_seconds: float = 0.0,
    max_teacher_seconds: float = 0.0,
    answered_share: float = 0.75,
    answers_file: Path | None = None,
    answers_only: bool = False,
    features: str = "layers",
    everyday: int = 0,
    everyday_file: Path | None = None,
    log=print,
) -> dict:
    """features: "layers" (the target's low, middle and final layers, see feature_layers) or
    "final" (its final-norm output alone). everyday: that many more prompts, written by the
    target from seed topics (drafter/everyday.py), all answered by it; everyday_file keeps them
    (read back when it exists), so a later run answers or trains on the same prompts."""
    torch.manual_seed(seed)
    started = time.perf_counter()
    target = open_checkpoint(target_spec)
    tcfg = target.config
    if tcfg.is_moe:
        raise ValueError(
            "lanes distill cannot train a drafter for a mixture-of-experts target yet (its head "
            "starts from the target's last layer, a dense one); use --drafter ngram or a model"
        )
    if tcfg.is_hybrid:
        raise ValueError(
            "lanes distill cannot train a drafter for a hybrid (DeltaNet) target yet; use "
            "--drafter ngram"
        )
    if not tcfg.tie_word_embeddings:
        raise ValueError("lanes distill uses the target's tied embedding as the drafter's LM head")
    sources = {"pydoc": pydoc_texts()}
    if "shakespeare" in corpus:
        sources["shakespeare"] = shakespeare_texts(log)
    examples = chat_examples(num_prompts + held_out, seed, snippet_chars, sources)
    train, test_prompts = examples[:num_prompts], [m for m, _ in examples[num_prompts:]]
    if answers_only and answers_file is None:
        raise ValueError("--answers-only needs --answers FILE")
    tok = target.tokenizer
    teacher = DenseTarget(
        target, device, torch.bfloat16 if device.startswith("cuda") else torch.float32
    )
    chats = read_or_write_everyday(
        everyday_file, everyday, target_writer(teacher, tok, teacher_batch, seed), seed, log
    )
    # the everyday prompts come first: all of them are answered (those that fit the context)
    fits = tcfg.max_position_embeddings - new_tokens
    chats = [c for c in chats if len(tok.encode_chat(c)) <= fits]
    prompts = [tok.encode_chat(messages) for messages in chats]
    prompts += [tok.encode_chat(messages) for messages, _ in train]
    num_answered += len(chats)
    answers = teacher_answers(
        teacher,
        prompts[:num_answered],
        new_tokens,
        seed,
        log,
        max_teacher_seconds,
        answers_file,
        teacher_batch,
    )
    if answers_only:  # make (or complete) the answers file, nothing else
        return {"answers_file": str(answers_file), "answers": len(read_answers(answers_file))}
    # the cheaper sequences: a prompt followed by the source text that comes after its snippet
    texts = [
        p + tok.encode(following, add_special_tokens=False)
        for p, (_, following) in zip(
            prompts[num_answered:], train[num_answered - len(chats) :], strict=True
        )
    ]
    if features not in ("layers", "final"):
        raise ValueError(f"features must be 'layers' or 'final', not {features!r}")
    layers = feature_layers(tcfg.num_layers) if features == "layers" else None
    data = teacher_data(teacher, answers + texts, log, layers)
    del teacher
    answered = data[: len(answers)]  # the target's own answers come first
    teacher_seconds = time.perf_counter() - started
    vocab = choose_vocab(data, draft_vocab, tcfg.vocab_size, tcfg.eos_token_ids)
    scfg = ModelConfig.from_hf(hf_config(tcfg, num_layers=1))
    head = EagleHead(scfg, target, vocab, device, layers)
    opt = torch.optim.AdamW(head.params.values(), lr=lr, weight_decay=0.0)
    rng = random.Random(seed)
    losses, agreements = [], []
    from huggingface_hub.utils import tqdm

    def pick() -> list[Example]:
        # the target's own answers are what the drafter meets when serving: a fixed share of
        # every batch, however few of them there are
        mine = round(batch * answered_share) if answered else 0
        return [rng.choice(answered) for _ in range(mine)] + [
            rng.choice(data) for _ in range(batch - mine)
        ]

    bar = tqdm(range(steps), desc="distill", unit="step", disable=None)
    train_start = time.perf_counter()
    for step in bar:
        # progress by steps, or by time when a budget is set: the schedule ends on time either way
        done = step / steps
        if max_train_seconds:
            done = max(done, (time.perf_counter() - train_start) / max_train_seconds)
            if done >= 1.0:
                break
        lr_now = lr * min(1.0, (step + 1) / 50) * 0.5 * (1 + math.cos(math.pi * done))
        for g in opt.param_groups:
            g["lr"] = lr_now
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.startswith("cuda")):
            loss, agree = batch_loss(head, pick(), depth, max_len, rng)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.params.values(), 1.0)
        opt.step()
        losses.append(loss.item())
        agreements.append(agree)
        shown = "/".join(f"{a:.2f}" for a in agree)
        bar.set_postfix(loss=f"{losses[-1]:.3f}", agree=shown)
        if step % 100 == 0:
            log(f"step {step} loss {losses[-1]:.3f} top-1 agreement per pass {shown}")
    train_seconds = time.perf_counter() - started - teacher_seconds
    save(head, scfg, out)
    report = {
        "kind": "eagle",
        "target_feature_layers": None if layers is None else list(layers),
        "target": target.source,
        "target_fingerprint": target.fingerprint,
        "shared_with_target": ["model.embed_tokens.weight"],
        "draft_vocab": len(vocab),
        "train_sequences": len(train) + len(chats),
        "everyday_prompts": len(chats),
        "answered_by_target": len(answered),
        "answered_tokens": sum(len(ex.ids) for ex in answered),
        "answered_share_of_batch": answered_share,
        "train_tokens": sum(len(ex.ids) for ex in data),
        "corpus": {k: len(v) for k, v in sources.items()},
        "new_tokens": new_tokens,
        "depth": depth,
        "steps": len(losses),
        "batch": batch,
        "teacher_seconds": round(teacher_seconds, 1),
        "train_seconds": round(train_seconds, 1),
        "final_loss": losses[-1],
        "final_agreement_per_pass": agreements[-1],
        "losses": [round(x, 4) for x in losses],
    }
    (out / "drafter.json").write_text(json.dumps(report, indent=2) + "\n")
    plot_losses(losses, out / "loss.png")
    if test_prompts:
        report["held_out"] = held_out_acceptance(target, out, test_prompts, new_tokens, device)
    report["seconds"] = round(time.perf_counter() - started, 1)
    (out / "drafter.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def save(head: EagleHead, cfg: ModelConfig, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    save_file(head.tensors(), out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(hf_config(cfg, num_layers=1), indent=2) + "\n")


def _device_rounds_run(engine) -> int:
    return engine.device_rounds.num_rounds if engine.device_rounds is not None else 0


def held_out_acceptance(
    target: Checkpoint,
    drafter: str | Path,
    prompts: list,
    new_tokens: int,
    device: str,
    num_draft_tokens: int = 4,
    draft_branches: int = 1,
    device_rounds: bool | None = None,
    batch: int | None = None,
) -> dict:
    """Mean drafts kept per verify step at k = `num_draft_tokens` (no adaptive k), greedy and at
    temperature 0.7 (coupled), on prompts not trained on; and that the drafted output is the
    undrafted one. `drafter`: any `--drafter` spec (a distill directory, DIR+ngram, ngram);
    `draft_branches`: trees of that many branches (lanes.drafter.eagle_branches);
    `device_rounds`: EngineConfig's (False: host-managed rounds only, for a comparison);
    `batch`: the prompts sent in groups of this many, one group after another (None: one
    batch)."""
    cfg = EngineConfig(
        device=device,
        drafter=str(drafter),
        num_draft_tokens=num_draft_tokens,
        adaptive_drafts=False,
        draft_branches=draft_branches,
        device_rounds=device_rounds,
    )
    engine = build_engine(checkpoint=target, config=cfg)
    size = batch or max(1, len(prompts))

    def generate(params: list[SamplingParams]) -> list:
        return [
            c
            for i in range(0, len(prompts), size)
            for c in engine.generate(prompts[i : i + size], params[i : i + size])
        ]

    result = {}
    for name, temp in (("greedy", 0.0), ("temperature_0.7", SAMPLED_TEMPERATURE)):
        params = [
            SamplingParams(max_tokens=new_tokens, temperature=temp, seed=1000 + i)
            for i in range(len(prompts))
        ]
        device_rounds_before = _device_rounds_run(engine)
        drafted = generate(params)
        device_rounds_run = _device_rounds_run(engine) - device_rounds_before
        plain = generate([dataclasses.replace(p, draft=False) for p in params])
        steps = sum(c.num_target_steps - 1 for c in drafted)  # the first token has no drafts
        kept = sum(c.num_accepted for c in drafted)
        result[name] = {
            "accepted_per_verify": round(kept / max(1, steps), 3),
            "tokens_per_target_step": round(
                sum(len(c.token_ids) for c in drafted) / max(1, steps), 3
            ),
            "tokens": sum(len(c.token_ids) for c in drafted),
            "device_rounds_run": device_rounds_run,
            "drafted_equals_undrafted": all(
                a.token_ids == b.token_ids for a, b in zip(drafted, plain, strict=True)
            ),
            # per prompt: (verify steps, drafts kept, tokens), for breakdowns by kind of prompt
            "by_prompt": [
                (c.num_target_steps - 1, c.num_accepted, len(c.token_ids)) for c in drafted
            ],
        }
    return result


def hf_config(cfg: ModelConfig, num_layers: int | None = None) -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers if num_layers is None else num_layers,
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
    ax.set(
        xlabel="step", ylabel="loss (soft CE + feature)", title="lanes distill (EAGLE-style head)"
    )
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
