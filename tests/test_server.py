"""The OpenAI-compatible server, driven by the official openai client over loopback HTTP."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import time
import urllib.error
import urllib.request

import openai
import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from tests.live_server import MODEL, LiveServer, read_stream, run_clients


@pytest.fixture(scope="module")
def server(long_model_server):
    return long_model_server


def test_models_health_and_errors(server):
    client = server.client()
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert json.loads(server.get("/health")) == {"status": "ok"}
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="x")
    with pytest.raises(openai.BadRequestError, match="top_p"):
        client.completions.create(model=MODEL, prompt="x", top_p=3)
    with pytest.raises(openai.BadRequestError, match="context"):
        client.completions.create(model=MODEL, prompt=[5] * 5000)
    with pytest.raises(openai.BadRequestError, match="presence_penalty"):
        client.completions.create(model=MODEL, prompt="x", presence_penalty=3.0)
    import http.client

    for body, headers, status in (
        (b"", {"Content-Length": str(5 * 2**20)}, 413),  # refused on the header, before the body
        (b"{not json", {"Content-Length": "9"}, 400),
    ):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.putrequest("POST", "/v1/completions")
        for k, v in headers.items():
            conn.putheader(k, v)
        conn.endheaders(body or None)
        reply = conn.getresponse()
        assert reply.status == status
        assert json.loads(reply.read())["error"]["message"]
        conn.close()
    # still serving after bad input
    assert client.completions.create(model=MODEL, prompt="x", max_tokens=2).choices[0].finish_reason


def test_vllm_utility_endpoints(server):
    """/v1/models/{id}, /tokenize (prompt and messages), /detokenize, /version, as vLLM has
    them; bad input gets a JSON error and the server goes on."""
    client = server.client()
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other-model")
    engine = server.engine
    status, body = server.post("/tokenize", {"prompt": "The quick brown fox"})
    out = json.loads(body)
    assert status == 200 and out["tokens"] == engine.tokenizer.encode("The quick brown fox")
    assert out["count"] == len(out["tokens"]) and out["max_model_len"] == engine.context_len
    chat = [{"role": "user", "content": "Hi there"}]
    status, body = server.post("/tokenize", {"messages": chat})
    assert status == 200 and json.loads(body)["tokens"] == engine.encode(chat)  # what chat runs
    status, body = server.post("/detokenize", {"tokens": out["tokens"]})
    assert status == 200 and json.loads(body)["prompt"] == "The quick brown fox"
    for path, bad in (
        ("/tokenize", {}),
        ("/tokenize", {"prompt": 5}),
        ("/tokenize", {"messages": [{"role": "user"}]}),
        ("/tokenize", {"messages": [{"role": "user", "content": "<|im_start|>system"}]}),
        ("/detokenize", {"tokens": [1, "x"]}),
        ("/detokenize", {"tokens": [10**9]}),
    ):
        status, body = server.post(path, bad)
        assert status == 400 and json.loads(body)["error"]["message"], (path, bad)
    assert json.loads(server.get("/version"))["version"]


def test_offsets_fingerprint_and_max_completion_tokens(server):
    """Streamed completions' text_offset goes on across chunks (it restarted at 0 in each);
    responses carry a system_fingerprint; completions take max_completion_tokens."""
    client = server.client()
    kw = dict(model=MODEL, prompt="The quick brown", temperature=0, logprobs=1)
    whole = client.completions.create(**kw, max_tokens=10, extra_body={"ignore_eos": True})
    offsets, tokens = [], []
    for chunk in client.completions.create(
        **kw, max_tokens=10, stream=True, extra_body={"ignore_eos": True}
    ):
        assert chunk.system_fingerprint == whole.system_fingerprint
        if chunk.choices and chunk.choices[0].logprobs:
            offsets += chunk.choices[0].logprobs.text_offset
            tokens += chunk.choices[0].logprobs.tokens
    assert offsets == whole.choices[0].logprobs.text_offset  # one sequence, as if not streamed
    assert offsets == [sum(len(t) for t in tokens[:i]) for i in range(len(tokens))]
    assert whole.system_fingerprint.startswith("lanes-")
    short = client.completions.create(
        model=MODEL, prompt="x", extra_body={"max_completion_tokens": 3, "ignore_eos": True}
    )
    assert short.usage.completion_tokens == 3


def test_request_ids_and_cors_headers(server):
    import urllib.request

    req = urllib.request.Request(server.url + "/health", headers={"X-Request-Id": "abc-123"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.headers["x-request-id"] == "abc-123"  # the client's own id comes back
    with urllib.request.urlopen(server.url + "/health", timeout=30) as r:
        assert len(r.headers["x-request-id"]) == 32  # else a new one


def _preflight(url: str, origin: str):
    import urllib.error
    import urllib.request

    preflight = urllib.request.Request(
        url + "/v1/chat/completions",
        method="OPTIONS",
        headers={"Origin": origin, "Access-Control-Request-Method": "POST"},
    )
    try:
        with urllib.request.urlopen(preflight, timeout=30) as r:
            return r.status, r.headers.get("access-control-allow-origin")
    except urllib.error.HTTPError as e:
        return e.code, e.headers.get("access-control-allow-origin")


def test_cors_only_for_the_origins_given(server, long_model_dir):
    """No CORS by default: a web page the user opens cannot drive a loopback server and read
    its answers. --allowed-origins lets the origins it names in, and only those."""
    status, allowed = _preflight(server.url, "http://localhost:3000")
    assert status == 405 and allowed is None
    engine = build_engine(str(long_model_dir))
    with LiveServer(engine, allowed_origins=("http://localhost:3000",)) as live:
        assert _preflight(live.url, "http://localhost:3000") == (200, "http://localhost:3000")
        assert _preflight(live.url, "http://evil.example")[1] is None


def test_several_served_names_and_a_log_line_per_request(long_model_dir, caplog):
    """vLLM's --served-model-name a b: either name is served and echoed; each request that
    ends leaves one log line with its outcome, tokens and times (none with log_requests off)."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    caplog.set_level("INFO", logger="lanes")
    with LiveServer(engine, names=["tiny", "alias"]) as live:
        client = live.client()
        assert [m.id for m in client.models.list().data] == ["tiny", "alias"]
        assert client.models.retrieve("alias").id == "alias"
        out = client.completions.create(
            model="alias", prompt="hello", max_tokens=5, extra_body={"ignore_eos": True}
        )  # a sampled EOS would end it "stop"
        assert out.model == "alias"
        stream = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        assert all(chunk.model == "tiny" for chunk in stream)
        with pytest.raises(openai.NotFoundError, match="'tiny', 'alias'"):
            client.completions.create(model="other", prompt="x")
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("request ")]
    assert len(lines) == 2
    assert lines[0].startswith(f"request {out.id}: ok | 1 choice | prompt ")
    assert f"completion {out.usage.completion_tokens} tokens" in lines[0]
    assert "TTFT " in lines[0] and "finish length" in lines[0]
    caplog.clear()
    with LiveServer(engine, log_requests=False) as live:
        live.client().completions.create(model=MODEL, prompt="hello", max_tokens=3)
    assert not [r for r in caplog.records if r.getMessage().startswith("request ")]


def test_completions_and_chat_streaming_and_not(server):
    client = server.client()
    kw = dict(model=MODEL, max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt="The quick brown", **kw)
    assert whole.usage.completion_tokens == 12 and whole.choices[0].finish_reason == "length"
    pieces = list(client.completions.create(prompt="The quick brown", stream=True, **kw))
    assert "".join(c.choices[0].text for c in pieces if c.choices) == whole.choices[0].text
    msgs = [{"role": "user", "content": "Paris is the capital of"}]
    chat = client.chat.completions.create(messages=msgs, **kw)
    assert chat.choices[0].message.role == "assistant"
    stream = client.chat.completions.create(
        messages=msgs, stream=True, stream_options={"include_usage": True}, **kw
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12 and chunks[-1].choices == []


def test_seeds_n_stop_and_logprobs(server):
    client = server.client()
    kw = dict(
        model=MODEL,
        prompt="Numbers 0123",
        max_tokens=10,
        temperature=0.9,
        extra_body={"ignore_eos": True},
    )
    a = client.completions.create(seed=7, n=3, **kw)
    b = client.completions.create(seed=7, n=3, **kw)
    assert [c.text for c in a.choices] == [c.text for c in b.choices]
    assert len({c.text for c in a.choices}) > 1  # n choices differ from one another
    free = client.completions.create(
        model=MODEL,
        prompt="The quick",
        max_tokens=12,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    text = free.choices[0].text
    stop = text[4:6]
    cut = client.completions.create(
        model=MODEL,
        prompt="The quick",
        max_tokens=12,
        temperature=0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert (
        cut.choices[0].text == text[: text.index(stop)] and cut.choices[0].finish_reason == "stop"
    )
    lp = (
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            temperature=0,
            logprobs=True,
            top_logprobs=3,
        )
        .choices[0]
        .logprobs.content
    )
    assert len(lp) >= 1
    for item in lp:
        assert len(item.top_logprobs) == 3
        best = max(t.logprob for t in item.top_logprobs)
        assert item.logprob == pytest.approx(best)  # greedy: the chosen token is the most likely
        assert all(t.logprob <= 0 for t in item.top_logprobs)


def test_draft_true_equals_draft_false_over_http(long_model_dir):
    engine = build_engine(str(long_model_dir), EngineConfig(drafter="ngram"))
    with LiveServer(engine) as live:
        client = live.client()
        for extra in ({}, {"seed": 3, "temperature": 0.8, "top_p": 0.9}):
            kw = dict(
                model=MODEL,
                prompt=[11, 12, 13, 14] * 10,
                max_tokens=30,
                **({"temperature": 0} | extra),
            )
            on = client.completions.create(
                **kw, extra_body={"draft": True, "ignore_eos": True, "cache_salt": "a"}
            )
            off = client.completions.create(
                **kw, extra_body={"draft": False, "ignore_eos": True, "cache_salt": "b"}
            )
            assert on.choices[0].text == off.choices[0].text
            assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
        assert json.loads(live.get("/debug/kv"))["integrity"] == "ok"


LONG = [random.Random(2).randrange(3, 380) for _ in range(3000)]


def test_disconnect_mid_prefill_then_retry_resumes(server):
    async def disconnect_early():
        client = server.async_client()
        stream = await client.completions.create(
            model=MODEL,
            prompt=LONG,
            max_tokens=8,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        await asyncio.sleep(0.3)  # prefill of 3000 tokens in 16-token forwards takes longer
        await stream.close()
        await client.close()

    asyncio.run(disconnect_early())
    deadline = time.time() + 30
    while server.kv()["active_lanes"] and time.time() < deadline:
        time.sleep(0.05)
    kv = server.kv()
    assert kv["active_lanes"] == 0 and kv["integrity"] == "ok"
    client = server.client()
    kw = dict(model=MODEL, prompt=LONG, max_tokens=8, temperature=0)
    retry = client.completions.create(**kw, extra_body={"ignore_eos": True})
    fresh = client.completions.create(**kw, extra_body={"ignore_eos": True, "cache_salt": "fresh"})
    assert 0 < retry.usage.prompt_tokens_details.cached_tokens < len(LONG) - 100  # mid-prefill
    assert fresh.usage.prompt_tokens_details.cached_tokens == 0
    assert retry.choices[0].text == fresh.choices[0].text


def test_twenty_clients_with_random_disconnects(server):
    rng = random.Random(8)
    prompts = [[rng.randrange(3, 380) for _ in range(rng.randint(5, 200))] for _ in range(20)]
    client = server.client()
    solo = [
        client.completions.create(
            model=MODEL,
            prompt=p,
            max_tokens=16,
            temperature=0.7,
            seed=i,
            extra_body={"ignore_eos": True, "cache_salt": "solo"},
        )
        .choices[0]
        .text
        for i, p in enumerate(prompts)
    ]

    async def one(i: int, client: openai.AsyncOpenAI):
        stream = await client.completions.create(
            model=MODEL,
            prompt=prompts[i],
            max_tokens=16,
            temperature=0.7,
            seed=i,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        quit_after = rng.randint(1, 12) if i % 3 == 0 else None  # a third of them hang up early
        return await read_stream(stream, quit_after)

    results = run_clients(server, one, 20)
    completed = [(i, t) for i, t in enumerate(results) if t is not None]
    assert len(completed) >= 10
    for i, text in completed:
        assert text == solo[i]
    assert json.loads(server.get("/health")) == {"status": "ok"}
    deadline = time.time() + 30
    while server.kv()["active_lanes"] and time.time() < deadline:
        time.sleep(0.05)
    kv = server.kv()
    assert kv["integrity"] == "ok" and kv["blocks_owned_by_lanes"] == 0 and kv["active_lanes"] == 0
    assert kv["blocks_free"] + kv["blocks_cached"] == kv["blocks_total"]
    metrics = server.get("/metrics")
    assert (
        "lanes_kv_integrity_ok 1.0" in metrics
        and "lanes_time_to_first_token_seconds_count" in metrics
    )


def test_vllm_metric_names_for_stock_dashboards(long_model_dir):
    """The series a vLLM dashboard reads, labelled model_name, with values that add up: one
    request each, its latencies and lengths, prefix-cache lookups, speculative counters."""
    import re

    from lanes.drafter.replay import ReplayProposer

    engine = build_engine(str(long_model_dir))
    prompt = "one two three one two three one two three " * 4
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    (plain,) = engine.generate([prompt], params, cache_salt="record")
    records = {tuple(engine.encode(prompt)): plain.token_ids}
    engine.proposer = ReplayProposer(records, 0.7, engine.model_config.vocab_size)
    queried_before = engine.metrics.queried_tokens  # the engine's counters include the record
    with LiveServer(engine) as live:
        client = live.client()
        for _ in range(2):  # the second finds the first's blocks in the prefix cache
            client.completions.create(
                model=MODEL, prompt=prompt, max_tokens=24, temperature=0,
                extra_body={"ignore_eos": True},
            )  # fmt: skip
        live.wait_idle()
        text = live.get("/metrics")

    def value(name: str) -> float:
        m = re.search(rf'^{re.escape(name)}\{{model_name="{MODEL}"[^}}]*\}} (\S+)$', text, re.M)
        assert m, name
        return float(m.group(1))

    assert value("vllm:e2e_request_latency_seconds_count") == 2
    for name in ("queue_time", "prefill_time", "decode_time"):
        assert value(f"vllm:request_{name}_seconds_count") == 2
    assert value("vllm:time_per_output_token_seconds_count") == 2 * 23
    assert value("vllm:request_generation_tokens_sum") == 48
    assert value("vllm:generation_tokens_total") == 48
    assert value("vllm:request_prompt_tokens_sum") == value("vllm:prompt_tokens_total") > 0
    queried, hits = value("vllm:prefix_cache_queries_total"), value("vllm:prefix_cache_hits_total")
    assert queried - queried_before == value("vllm:prompt_tokens_total") and 0 < hits < queried
    drafts = value("vllm:spec_decode_num_draft_tokens_total")
    assert 0 < value("vllm:spec_decode_num_accepted_tokens_total") < drafts
    assert value("vllm:spec_decode_num_drafts_total") > 0
    # per draft position: kept drafts add up to the total, none kept where none was drafted, and
    # a later position keeps no more than an earlier one (a draft is kept only after the ones
    # before it)
    per_pos = {
        int(pos): float(v)
        for pos, v in re.findall(
            r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{model_name="tiny",'
            r'position="(\d+)"\} (\S+)$', text, re.M
        )
    }  # fmt: skip
    assert sorted(per_pos) == list(range(len(per_pos))) and len(per_pos) >= 2
    assert sum(per_pos.values()) == value("vllm:spec_decode_num_accepted_tokens_total")
    assert all(per_pos[j] >= per_pos[j + 1] for j in range(len(per_pos) - 1))
    assert 'lanes_draft_acceptance_rate_per_position{model_name="tiny",position="0"}' in text
    # docs/grafana-dashboard.json reads only series this server exports
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[1] / "docs/grafana-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    wanted = {n for e in exprs for n in re.findall(r"\b(?:vllm:|lanes_)[a-zA-Z0-9_:]+", e)}
    exported = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)[{ ]", text, re.M))
    assert len(wanted) > 20 and wanted <= exported, wanted - exported
    assert value("vllm:num_requests_running") == 0 and value("vllm:num_preemptions_total") == 0
    assert 'vllm:request_success_total{finished_reason="length",model_name="' in text


def test_api_key(long_model_dir):
    engine = build_engine(str(long_model_dir))
    with LiveServer(engine, api_key="sesame") as live:
        with pytest.raises(openai.AuthenticationError):
            live.client(api_key="wrong").models.list()
        assert live.client(api_key="sesame").models.list().data[0].id == MODEL
        assert json.loads(live.get("/health"))["status"] == "ok"  # health needs no key


def _stream_lines(port: int, body: dict, key: str) -> list[str]:
    """POST a streaming completion; the SSE data lines until the server closes the stream."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {key}"}
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        reply = conn.getresponse()
        return [line.decode().strip() for line in reply if line.startswith(b"data:")]
    except (OSError, http.client.HTTPException) as e:
        return [f"connection error: {e!r}"]
    finally:
        conn.close()


def test_sigterm_mid_prefill_ends_every_stream(long_model_dir):
    """SIGTERM with 10 long prompts in prefill: every stream ends with a finish_reason and
    [DONE], the process exits within the graceful timeout, and logs no traceback. The API key
    comes from $LANES_API_KEY (not the command line, where `ps` would show it)."""
    import os
    import signal
    import subprocess
    import sys
    from concurrent.futures import ThreadPoolExecutor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lanes.cli",
            "serve",
            "--model",
            str(long_model_dir),
            "--port",
            str(port),
            "--served-model-name",
            MODEL,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "LANES_API_KEY": "sesame"},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                assert time.time() < deadline and proc.poll() is None, "server did not start"
                time.sleep(0.1)
        bodies = [
            dict(
                model=MODEL,
                prompt=LONG[i:] + LONG[:i],
                max_tokens=1000,
                stream=True,
                ignore_eos=True,
            )
            for i in range(10)
        ]
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "/v1/models", timeout=5)
        assert e.value.code == 401
        with ThreadPoolExecutor(10) as pool:
            streams = [pool.submit(_stream_lines, port, b, "sesame") for b in bodies]
            deadline = time.time() + 30
            while True:  # every request has reached the engine
                kv = json.loads(urllib.request.urlopen(url + "/debug/kv", timeout=5).read())
                if kv["active_lanes"] + kv["waiting_lanes"] == 10:
                    break
                assert time.time() < deadline, kv
                time.sleep(0.02)
            start = time.time()
            proc.send_signal(signal.SIGTERM)
            results = [f.result(timeout=30) for f in streams]
        proc.wait(timeout=20)
        assert time.time() - start < 5
        for lines in results:
            assert lines[-1] == "data: [DONE]", lines[-3:]
            reasons = [
                c["finish_reason"]
                for line in lines[:-1]
                for c in json.loads(line.removeprefix("data:"))["choices"]
            ]
            assert reasons[-1] in ("abort", "length"), lines[-3:]
        log = proc.stdout.read()
        assert "Traceback" not in log, log
        assert (
            "serving tiny" in log and "exact mode" in log and f"http://127.0.0.1:{port}/v1" in log
        )
    finally:
        if proc.poll() is None:
            proc.kill()
