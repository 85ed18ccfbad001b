"""The everyday training prompts (drafter/everyday.py): their shape, and that their seeds share no
text with the held-out everyday set the drafters are measured on."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lanes.drafter import everyday

HELD_OUT = Path(__file__).resolve().parent.parent / "bench" / "data" / "everyday_prompts.json"


def _shingles(text: str, n: int = 4) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def _seed_texts() -> list[str]:
    texts = [t for topics in everyday.TOPICS.values() for t in topics]
    texts += list(everyday._ASK_USER.values()) + sum(everyday._FALLBACK.values(), [])
    texts += everyday.SYSTEM_PROMPTS + everyday.FOLLOW_UPS + [everyday._WRITE_DOCUMENT]
    texts += [q for qs in everyday.DOCUMENTS.values() for q in qs]
    return texts


def _overlap(seeds: list[str], held_out: list[str]) -> set:
    seen = set().union(*(_shingles(t) for t in seeds))
    return seen & set().union(*(_shingles(t) for t in held_out))


def test_seeds_share_no_text_with_the_held_out_set():
    prompts = json.loads(HELD_OUT.read_text())["prompts"]
    held_out = [m["content"] for p in prompts for m in p["messages"]]
    assert len(prompts) >= 60
    assert not _overlap(_seed_texts(), held_out)
    # negative control: one held-out follow-up among the seeds is found
    assert _overlap([*_seed_texts(), prompts[45]["messages"][-1]["content"]], held_out)


def _fake_target(replies: list[str]):
    calls = []

    def generate(chats, max_new_tokens, temperature):
        calls.append((len(chats), max_new_tokens, temperature))
        return [replies[i % len(replies)] for i in range(len(chats))]

    return generate, calls


def test_everyday_prompts_cover_every_form_and_category():
    generate, calls = _fake_target(["How do I do this well?", "Sure. Here is an answer."])
    chats = everyday.everyday_prompts(120, generate, seed=3)
    assert len(chats) == 120 and len(calls) == 3  # questions, documents, first answers
    assert all(c[-1]["role"] == "user" and c[-1]["content"] for c in chats)
    system = [c for c in chats if c[0]["role"] == "system"]
    multi = [c for c in chats if any(m["role"] == "assistant" for m in c)]
    documents = [c for c in chats if c[0]["content"].startswith("Read this ")]
    assert system and multi and documents
    assert all(c[-1]["content"] in everyday.FOLLOW_UPS for c in multi)
    assert all(c[0]["content"].split("\n\n")[1] for c in documents)  # the document's body
    assert everyday.everyday_prompts(120, _fake_target(["How do I do this well?"])[0], 3) != chats
    again = everyday.everyday_prompts(120, _fake_target(["How do I do this well?"])[0], 3)
    assert again == everyday.everyday_prompts(120, _fake_target(["How do I do this well?"])[0], 3)


def test_unusable_user_turns_fall_back_to_the_seed_topic():
    generate, _ = _fake_target(["", "I'm sorry, I can't help with that.", "x" * 400])
    chats = everyday.everyday_prompts(30, generate, seed=0)
    singles = [c for c in chats if len(c) == 1 and not c[0]["content"].startswith("Read this ")]
    assert singles
    fallbacks = {f.split("{topic}")[0] for fs in everyday._FALLBACK.values() for f in fs}
    assert all(any(c[0]["content"].startswith(f) for f in fallbacks) for c in singles)


def test_clean_question():
    clean = everyday.clean_question
    assert clean('Question: "How do magnets work?"\nMore text') == "How do magnets work?"
    assert clean("\n\n  What is a hash table?  ") == "What is a hash table?"
    assert clean('A student might ask: "Why does ice float on water?"') == (
        "Why does ice float on water?"
    )
    assert clean("How about this: What is the best way to learn chess?") == (
        "What is the best way to learn chess?"
    )
    assert clean("Write a limerick about a cat who hates Mondays.") is not None  # a request
    assert clean("Why?") is None  # too short to be a real turn
    assert clean("Sorry, I cannot do that.") is None
    assert clean("What would I ask? An AI assistant can with no command.") is None
    assert clean("Hello, I'm thrilled to assist you with your application.") is None
    assert clean("   \n ") is None


def test_everyday_file_is_read_back_instead_of_rewritten(tmp_path):
    from lanes.drafter.distill import read_or_write_everyday

    path = tmp_path / "everyday.json"
    generate, calls = _fake_target(["What is a good first question?"])
    made = read_or_write_everyday(path, 12, generate, 0, lambda m: None)
    assert len(made) == 12 and calls

    def refuse(*args):
        raise AssertionError("the prompts were in the file")

    logs = []
    assert read_or_write_everyday(path, 12, refuse, 0, logs.append) == made
    assert "read from" in logs[0]
    assert read_or_write_everyday(path, 8, refuse, 0, logs.append) == made[:8]


def test_everyday_file_with_fewer_prompts_is_extended_not_rewritten(tmp_path):
    from lanes.drafter.distill import read_or_write_everyday

    path = tmp_path / "everyday.json"
    generate, _ = _fake_target(["What is a good first question?"])
    first = read_or_write_everyday(path, 12, generate, 0, lambda m: None)
    asked = []

    def counting(chats, max_new_tokens, temperature):
        asked.append(len(chats))
        return generate(chats, max_new_tokens, temperature)

    grown = read_or_write_everyday(path, 20, counting, 0, lambda m: None)
    assert grown[:12] == first and len(grown) == 20
    assert sum(asked) <= 8 * 2  # only the 8 new prompts were written (questions, then firsts)
    assert read_or_write_everyday(path, 20, counting, 0, lambda m: None) == grown
