"""Conformance: every request field docs/serving.md lists, driven through the official `openai`
client (sync, async and streaming) against a live server. The documented fields and the checks
here must match one to one, so a field documented without a check (or a check of a field the
docs dropped) fails first."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import openai
import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer
from tests.live_server import MODEL, LiveServer

DOCS = Path(__file__).parents[1] / "docs" / "serving.md"
REPEATS = "one two three four five one two three four five one two three four five"
CHAT = [{"role": "user", "content": "Say something."}]
FREE = {"ignore_eos": True}  # outputs run to max_tokens


def documented_fields() -> set[str]:
    """The fields of the Request fields table, one per backticked name."""
    table = DOCS.read_text().split("## Request fields", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1] for line in table.splitlines()[2:] if line.startswith("|")]
    return {name for row in rows for name in re.findall(r"`([a-z_.]+)`", row)}


@pytest.fixture(scope="module")
def server(long_model_dir):
    """A server whose drafter replays REPEATS' greedy continuation, 70% of drafts right."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    ids = engine.encode(REPEATS)
    (plain,) = engine.generate([ids], SamplingParams(max_tokens=30, ignore_eos=True))
    vocab = engine.model_config.vocab_size
    engine.proposer = ReplayProposer({tuple(ids): plain.token_ids}, 0.7, vocab)
    with LiveServer(engine, report_cached_tokens=True) as live:
        yield live


def complete(client, **kw):
    kw.setdefault("max_tokens", 8)
    return client.completions.create(model=MODEL, prompt=kw.pop("prompt", REPEATS), **kw)


def chat(client, **kw):
    kw.setdefault("max_tokens", 8)
    return client.chat.completions.create(model=MODEL, messages=kw.pop("messages", CHAT), **kw)


def check_model(c, ac):
    assert complete(c).model == MODEL
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="another-model", prompt="a")


def check_prompt(c, ac):
    assert len(complete(c, prompt=["a b", "c d"]).choices) == 2
    ids = complete(c, prompt=[5, 6, 7], max_tokens=3, extra_body=FREE)
    assert ids.usage.prompt_tokens == 3 and ids.usage.completion_tokens == 3


def check_messages(c, ac):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Say something."}]}]
    a = chat(c, messages=parts, temperature=0, extra_body=FREE)
    b = chat(c, temperature=0, extra_body=FREE)
    assert a.choices[0].message.content == b.choices[0].message.content  # parts == the string


def check_max_tokens(c, ac):
    assert complete(c, max_tokens=5, extra_body=FREE).usage.completion_tokens == 5
    assert chat(c, max_tokens=4, extra_body=FREE).usage.completion_tokens == 4


def check_max_completion_tokens(c, ac):
    out = chat(c, max_tokens=9, max_completion_tokens=3, extra_body=FREE)
    assert out.usage.completion_tokens == 3  # preferred over max_tokens
    extra = {"max_completion_tokens": 2, **FREE}
    assert complete(c, max_tokens=9, extra_body=extra).usage.completion_tokens == 2


def check_temperature(c, ac):
    texts = {complete(c, temperature=0, extra_body=FREE).choices[0].text for _ in range(2)}
    assert len(texts) == 1
    with pytest.raises(openai.BadRequestError, match="temperature"):
        complete(c, temperature=2.5)


def check_top_p(c, ac):
    greedy = complete(c, temperature=0, extra_body=FREE).choices[0].text
    assert complete(c, temperature=1.0, top_p=1e-9, seed=3, extra_body=FREE).choices[0].text == (
        greedy
    )  # the nucleus of a tiny top_p is the most likely token
    with pytest.raises(openai.BadRequestError, match="top_p"):
        complete(c, top_p=0)


def check_top_k(c, ac):
    greedy = complete(c, temperature=0, extra_body=FREE).choices[0].text
    out = complete(c, temperature=1.0, seed=4, extra_body={"top_k": 1, **FREE})
    assert out.choices[0].text == greedy
    with pytest.raises(openai.BadRequestError, match="top_k"):
        complete(c, extra_body={"top_k": -2})


def check_seed(c, ac):
    a, b = (complete(c, temperature=1.0, seed=7, n=2, extra_body=FREE) for _ in range(2))
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert a.choices[0].text != a.choices[1].text  # choice i samples with seed + i


def check_stop(c, ac):
    text = complete(c, temperature=0, max_tokens=12, extra_body=FREE).choices[0].text
    word = re.findall(r"[A-Za-z]{2,}", text[2:])[0]  # letters: whole characters of the text
    out = complete(c, temperature=0, max_tokens=12, stop=[word], extra_body=FREE).choices[0]
    assert out.finish_reason == "stop" and word not in out.text and text.startswith(out.text)


def check_n(c, ac):
    assert len(chat(c, n=3, seed=1).choices) == 3
    with pytest.raises(openai.BadRequestError, match="'n'"):
        complete(c, n=17)


def check_logprobs(c, ac):
    lp = complete(c, logprobs=2, max_tokens=3, extra_body=FREE).choices[0].logprobs
    # top alternatives keyed by their text (OpenAI's format): two may share a text
    assert len(lp.tokens) == 3 and all(1 <= len(t) <= 2 for t in lp.top_logprobs)
    content = chat(c, logprobs=True, max_tokens=3, extra_body=FREE).choices[0].logprobs.content
    assert len(content) == 3 and all(x.logprob <= 0 for x in content)


def check_top_logprobs(c, ac):
    content = chat(c, logprobs=True, top_logprobs=3, max_tokens=2).choices[0].logprobs.content
    assert all(len(x.top_logprobs) == 3 for x in content)


def check_stream(c, make_async):
    async def both():
        ac = make_async()
        whole = await ac.completions.create(
            model=MODEL, prompt=REPEATS, max_tokens=6, temperature=0, extra_body=FREE
        )
        stream = await ac.completions.create(
            model=MODEL, prompt=REPEATS, max_tokens=6, temperature=0, extra_body=FREE,
            stream=True,
        )  # fmt: skip
        text = "".join([ch.choices[0].text async for ch in stream if ch.choices])
        await ac.close()
        return whole.choices[0].text, text

    whole, streamed = asyncio.run(both())
    assert streamed == whole


def check_stream_options_include_usage(c, ac):
    chunks = list(
        chat(c, stream=True, stream_options={"include_usage": True}, max_tokens=3, extra_body=FREE)
    )
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 3


def check_draft(c, ac):
    kw = dict(temperature=0, max_tokens=30)
    drafted = complete(c, **kw, extra_body=FREE)
    plain = complete(c, **kw, extra_body={"draft": False, **FREE})
    assert drafted.choices[0].text == plain.choices[0].text

    def verified(x):
        d = x.usage.completion_tokens_details
        return d.accepted_prediction_tokens + d.rejected_prediction_tokens

    assert verified(drafted) > 0 and verified(plain) == 0  # drafts verified, then none
    assert drafted.usage.completion_tokens_details.accepted_prediction_tokens > 0


def check_cache_salt(c, ac):
    prompt = REPEATS * 3
    first = complete(c, prompt=prompt, extra_body={"cache_salt": "a"})
    again = complete(c, prompt=prompt, extra_body={"cache_salt": "a"})
    other = complete(c, prompt=prompt, extra_body={"cache_salt": "b"})
    cached = [x.usage.prompt_tokens_details.cached_tokens for x in (first, again, other)]
    assert cached[0] == 0 and cached[1] > 0 and cached[2] == 0


def check_ignore_eos(c, ac):
    assert complete(c, max_tokens=30, extra_body=FREE).usage.completion_tokens == 30


def check_presence_penalty(c, ac):
    assert complete(c, presence_penalty=1.5).choices
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        complete(c, presence_penalty=2.5)


def check_frequency_penalty(c, ac):
    greedy = complete(c, temperature=0, max_tokens=20, extra_body=FREE).choices[0].text
    pushed = complete(c, temperature=0, max_tokens=20, frequency_penalty=2.0, extra_body=FREE)
    assert pushed.choices[0].text != greedy  # repeats cost: a random model's loops break
    with pytest.raises(openai.BadRequestError, match="frequency_penalty"):
        complete(c, frequency_penalty=-3)


def check_repetition_penalty(c, ac):
    assert complete(c, extra_body={"repetition_penalty": 1.3}).choices
    with pytest.raises(openai.BadRequestError, match="repetition_penalty"):
        complete(c, extra_body={"repetition_penalty": 0})


def check_min_p(c, ac):
    greedy = complete(c, temperature=0, extra_body=FREE).choices[0].text
    out = complete(c, temperature=1.0, seed=5, extra_body={"min_p": 1.0, **FREE})
    assert out.choices[0].text == greedy  # only the most likely token passes min_p 1
    with pytest.raises(openai.BadRequestError, match="min_p"):
        complete(c, extra_body={"min_p": 1.5})


def check_min_tokens(c, ac):
    out = complete(c, max_tokens=12, extra_body={"min_tokens": 12, "stop_token_ids": [5]})
    assert out.usage.completion_tokens == 12


def check_logit_bias(c, ac):
    out = complete(c, max_tokens=5, temperature=0, logit_bias={"42": 100}, logprobs=0,
                   extra_body=FREE)  # fmt: skip
    assert out.choices[0].logprobs.tokens and len(set(out.choices[0].logprobs.tokens)) == 1
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        complete(c, logit_bias={"42": 101})


def _tokens(c, text: str) -> list[int]:
    """The server's token ids of a text (its /tokenize, no special tokens)."""
    import json
    import urllib.request

    url = str(c.base_url).removesuffix("/").removesuffix("/v1") + "/tokenize"
    body = json.dumps({"prompt": text, "add_special_tokens": False}).encode()
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        return json.loads(r.read())["tokens"]


def check_stop_token_ids(c, ac):
    forced = {"logit_bias": {"42": 100}}  # every token is 42
    out = complete(c, max_tokens=6, extra_body={**FREE, **forced, "stop_token_ids": [42]})
    assert (out.choices[0].finish_reason, out.usage.completion_tokens) == ("stop", 1)


def check_include_stop_str_in_output(c, ac):
    text = complete(c, temperature=0, max_tokens=12, extra_body=FREE).choices[0].text
    word = re.findall(r"[A-Za-z]{2,}", text[2:])[0]
    body = {**FREE, "include_stop_str_in_output": True}
    out = complete(c, temperature=0, max_tokens=12, stop=[word], extra_body=body).choices[0]
    assert out.finish_reason == "stop" and out.text == text[: text.index(word) + len(word)]


def check_allowed_token_ids(c, ac):
    only = complete(c, max_tokens=5, temperature=0.9, seed=3,
                    extra_body={**FREE, "allowed_token_ids": [42]})  # fmt: skip
    forced = complete(
        c, max_tokens=5, temperature=0, extra_body={**FREE, "logit_bias": {"42": 100}}
    )
    assert only.choices[0].text == forced.choices[0].text
    with pytest.raises(openai.BadRequestError, match="allowed_token_ids"):
        complete(c, extra_body={"allowed_token_ids": [10**9]})


def check_bad_words(c, ac):
    free = complete(c, temperature=0, max_tokens=12, extra_body=FREE).choices[0].text
    word = re.findall(r"[A-Za-z]{2,}", free)[0]
    for draft in (True, False):
        body = {**FREE, "bad_words": [word], "draft": draft}
        text = complete(c, temperature=0, max_tokens=12, extra_body=body).choices[0].text
        ids = _tokens(c, text)
        for banned in (_tokens(c, word), _tokens(c, " " + word)):
            n = len(banned)
            assert all(ids[i : i + n] != banned for i in range(len(ids))), (word, text)
        assert text != free
    with pytest.raises(openai.BadRequestError, match="bad_words"):
        complete(c, extra_body={"bad_words": "one"})


def check_truncate_prompt_tokens(c, ac):
    ids = _tokens(c, REPEATS)
    cut = complete(c, temperature=0, extra_body={**FREE, "truncate_prompt_tokens": 5})
    tail = complete(c, temperature=0, prompt=ids[-5:], extra_body=FREE)
    assert cut.usage.prompt_tokens == 5 and cut.choices[0].text == tail.choices[0].text


def check_chat_template_kwargs(c, ac):
    # the tiny model's template reads no extra names: they are passed and change nothing here
    # (tests/test_vllm_fields.py renders one that reads enable_thinking)
    plain = chat(c, temperature=0, extra_body=FREE).choices[0].message.content
    kw = chat(
        c, temperature=0, extra_body={**FREE, "chat_template_kwargs": {"enable_thinking": False}}
    )
    assert kw.choices[0].message.content == plain
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        chat(c, extra_body={"chat_template_kwargs": {"messages": []}})


def check_documents(c, ac):
    # the tiny model's template reads no documents: accepted, and checked for shape
    # (tests/test_vllm_fields.py renders a template that reads them)
    assert chat(c, extra_body={"documents": [{"title": "t", "text": "x"}]}).choices
    with pytest.raises(openai.BadRequestError, match="documents"):
        chat(c, extra_body={"documents": [{"title": 1}]})


def check_echo(c, ac):
    out = complete(c, temperature=0, logprobs=1, echo=True, extra_body=FREE).choices[0]
    plain = complete(c, temperature=0, logprobs=1, extra_body=FREE).choices[0]
    assert out.text == REPEATS + plain.text
    lp = out.logprobs
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.token_logprobs[-8:] == plain.logprobs.token_logprobs
    only = complete(c, max_tokens=0, echo=True)
    assert (only.choices[0].text, only.usage.completion_tokens) == (REPEATS, 0)
    with pytest.raises(openai.BadRequestError, match="echo"):
        chat(c, extra_body={"echo": True})


def check_prompt_logprobs(c, ac):
    out = chat(c, max_tokens=1, extra_body={"prompt_logprobs": 1}).model_dump()
    scored = out["prompt_logprobs"]
    assert scored[0] is None and all(min(v["rank"] for v in e.values()) == 1 for e in scored[1:])
    with pytest.raises(openai.BadRequestError, match="prompt_logprobs"):
        complete(c, extra_body={"prompt_logprobs": 21})


def check_return_token_ids(c, ac):
    out = complete(
        c, prompt=[5, 6, 7], temperature=0, extra_body={"return_token_ids": True, **FREE}
    )
    (choice,) = out.model_dump()["choices"]
    assert choice["prompt_token_ids"] == [5, 6, 7]
    assert len(choice["token_ids"]) == out.usage.completion_tokens == 8
    body = {"return_token_ids": True, **FREE}
    chunks = [x.model_dump() for x in complete(c, prompt=[5, 6, 7], temperature=0, stream=True,
                                               extra_body=body)]  # fmt: skip
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [5, 6, 7]
    assert sum((x["choices"][0].get("token_ids", []) for x in chunks), []) == choice["token_ids"]
    whole = chat(c, temperature=0, extra_body=body).model_dump()
    streamed = [x.model_dump() for x in chat(c, temperature=0, stream=True, extra_body=body)]
    assert whole["prompt_token_ids"] == streamed[0]["prompt_token_ids"]
    ids = sum((x["choices"][0].get("token_ids", []) for x in streamed if x["choices"]), [])
    assert ids == whole["choices"][0]["token_ids"] and len(ids) == 8
    assert "token_ids" not in chat(c, temperature=0).model_dump()["choices"][0]


def check_return_draft_spans(c, ac):
    body = {"return_draft_spans": True, **FREE}
    out = complete(c, temperature=0, max_tokens=30, extra_body=body)
    spans = out.model_dump()["choices"][0]["draft_spans"]
    assert "".join(text for text, _ in spans) == out.choices[0].text
    assert any(drafted for _, drafted in spans) and not all(drafted for _, drafted in spans)
    assert out.usage.completion_tokens_details.accepted_prediction_tokens > 0
    plain = complete(c, temperature=0, max_tokens=30, extra_body={"draft": False, **body})
    assert [t for t, _ in plain.model_dump()["choices"][0]["draft_spans"]] == [
        plain.choices[0].text
    ]
    assert not plain.model_dump()["choices"][0]["draft_spans"][0][1]  # nothing from drafts
    # chunk by chunk: each chunk's runs cover its text (which drafts were kept can differ
    # from the request above: the replayed drafts are right at random)
    chunks = [x.model_dump()["choices"][0]
              for x in complete(c, temperature=0, max_tokens=30, stream=True, extra_body=body)]  # fmt: skip
    assert all("".join(t for t, _ in x.get("draft_spans", [])) == x["text"] for x in chunks)
    assert "".join(x["text"] for x in chunks) == out.choices[0].text
    assert any(d for x in chunks for _, d in x.get("draft_spans", []))


CHECKS = {name.removeprefix("check_").replace("stream_options_include_usage",
          "stream_options.include_usage"): f
          for name, f in dict(globals()).items() if name.startswith("check_")}  # fmt: skip


def test_every_documented_field_has_a_check():
    assert documented_fields() == set(CHECKS)


@pytest.mark.parametrize("field", sorted(CHECKS))
def test_field(server, field):
    CHECKS[field](server.client(), server.async_client)
