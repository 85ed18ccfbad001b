"""The lanes console (lanes/console/, lanes/console_routes.py): its endpoints over HTTP, and the
page itself driven in headless Chromium (Playwright with the distribution's browser) against a
live server on a tiny model: a chat, a compare whose verdict must say identical, a share change
that the rounds view shows."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from lanes import EngineConfig, SamplingParams, build_engine
from lanes.drafter.replay import ReplayProposer
from tests.live_server import LiveServer, openai_error

SHOTS = os.environ.get("LANES_CONSOLE_SHOTS")  # a folder: the test saves the views' screenshots
KEY = "console-test-key"


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


SYSTEM = "You are terse."
CHAT = "one two three one two three"
COMPARE = "a b c a b c a b c"
NEW_TOKENS = 24


@pytest.fixture(scope="module")
def server(long_model_dir):
    """A server whose drafter replays the target's greedy answers to the page's two prompts,
    70% of drafts right (no real drafter agrees with a random tiny model)."""
    engine = build_engine(str(long_model_dir), EngineConfig(prefill_chunk=16))
    greedy = SamplingParams(max_tokens=NEW_TOKENS)
    records = {}
    for text in (CHAT, COMPARE):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
        ids = engine.make_lane(messages, greedy).prompt_ids
        (plain,) = engine.generate([ids], greedy)
        records[tuple(ids)] = plain.token_ids
    engine.proposer = ReplayProposer(records, 0.7, engine.model_config.vocab_size)
    with LiveServer(engine, api_key=KEY) as live:
        yield live


def get(server, path: str, key: str | None = KEY) -> tuple[int, bytes, str]:
    request = urllib.request.Request(server.url + path)
    if key:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, r.read(), r.headers.get("content-type", "")
    except urllib.error.HTTPError as e:
        return e.code, e.read(), e.headers.get("content-type", "")


def test_the_page_and_its_files_are_served_offline(server):
    status, page, kind = get(server, "/", key=None)  # the page holds no data: no key needed
    assert status == 200 and kind.startswith("text/html")
    for name in ("console.css", "console.js"):
        assert f"/console/{name}".encode() in page
        status, body, _ = get(server, f"/console/{name}", key=None)
        assert status == 200 and body
    # nothing from another host: the page works offline
    for name in ("console.html", "console.css", "console.js"):
        text = (Path(__file__).parents[1] / "lanes" / "console" / name).read_text()
        assert "http://" not in text and "https://" not in text, name
    status, body, _ = get(server, "/console/../server.py", key=None)
    assert status == 404


def test_the_data_routes_need_the_key(server):
    for path in ("/v1/lanes/rounds", "/v1/lanes/prefill_share"):
        status, body, _ = get(server, path, key=None)
        assert status == 401 and openai_error(body)["type"] == "authentication_error"
    status, body = server.post("/v1/lanes/prefill_share", {"prefill_share": 0.2})
    assert status == 401
    assert server.engine.share.share == 0.5  # unchanged


def test_rounds_come_in_order_and_after_an_index(server):
    server.client(api_key=KEY).completions.create(model="tiny", prompt="a b c", max_tokens=4)
    status, body, _ = get(server, "/v1/lanes/rounds")
    assert status == 200
    report = json.loads(body)
    indexes = [r["index"] for r in report["rounds"]]
    assert indexes == list(range(report["next"] - len(indexes), report["next"])) and indexes
    assert report["latencies"][-1]["tokens"] == 4
    status, body, _ = get(server, f"/v1/lanes/rounds?after={report['next']}")
    assert json.loads(body)["rounds"] == []
    for bad in ("-1", "%C2%B2", "x"):  # "²" is a digit to Python, not an index
        status, body, _ = get(server, f"/v1/lanes/rounds?after={bad}")
        assert status == 400 and openai_error(body)["param"] == "after", bad


def test_the_share_changes_for_the_next_rounds_and_outputs_stay_identical(server):
    auth = {"Authorization": f"Bearer {KEY}"}
    prompt = "one two three " * 12
    client = server.client(api_key=KEY)

    def run() -> list[str]:
        # a prompt chunked beside a decoding lane: where its chunks land depends on the share
        out = [None, None]

        def one(i, p):
            out[i] = (
                client.completions.create(
                    model="tiny",
                    prompt=p,
                    max_tokens=12,
                    temperature=0,
                    extra_body={"ignore_eos": True},
                )
                .choices[0]
                .text
            )

        threads = [threading.Thread(target=one, args=(0, "x y")),
                   threading.Thread(target=one, args=(1, prompt))]  # fmt: skip
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    before = run()
    try:
        status, body = server.post("/v1/lanes/prefill_share", {"prefill_share": 0.05}, auth)
        assert status == 200 and json.loads(body) == {"prefill_share": 0.05, "previous": 0.5}
        assert server.engine.share.share == 0.05
        assert run() == before
        for bad in ({"prefill_share": 1.5}, {"prefill_share": "0.3"}, {"prefill_share": True}, {}):
            status, body = server.post("/v1/lanes/prefill_share", bad, auth)
            assert status == 400 and openai_error(body)["param"] == "prefill_share", bad
        assert server.engine.share.share == 0.05
    finally:
        server.post("/v1/lanes/prefill_share", {"prefill_share": 0.5}, auth)


def test_the_console_in_a_browser(server, tmp_path):
    browser_path = chromium()
    if browser_path is None:
        pytest.skip("no Chromium installed (apt-get install chromium): the browser test needs one")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    shots = Path(SHOTS) if SHOTS else tmp_path
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=browser_path, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url + "/")
            expect = sync_api.expect
            expect(page.locator("#model")).to_contain_text("API key")  # 401 without the key
            page.fill("#api-key", KEY)
            page.dispatch_event("#api-key", "change")
            expect(page.locator("#model")).to_have_text("model: tiny")

            # chat: greedy, streamed, two turns
            page.click("summary")
            page.fill("#max-tokens", str(NEW_TOKENS))
            page.fill("#system", SYSTEM)
            page.fill("#chat-input", CHAT)
            page.keyboard.press("Enter")  # Enter sends
            reply = page.locator(".msg.assistant .stats").first
            expect(reply).to_contain_text("tokens per verify", timeout=60_000)
            assert page.locator(".msg.assistant .body").first.inner_text().strip()
            page.screenshot(path=str(shots / "console-chat.png"))

            # compare: drafted against draft: false, side by side
            page.keyboard.press("Escape")
            page.click("#tab-compare")
            page.fill("#compare-input", COMPARE)
            page.click("#compare-run")
            verdict = page.locator("#compare-verdict")
            expect(verdict).to_have_text(re.compile(r"identical: \d+ tokens"), timeout=60_000)
            assert (
                page.locator("#out-drafted").inner_text() == page.locator("#out-plain").inner_text()
            )
            stats = page.locator("#stats-drafted").inner_text()
            kept = int(re.search(r"(\d+) from drafts", stats).group(1))
            # accepted drafts are highlighted on the drafted side, nothing on the other
            assert kept > 0 and page.locator("#out-drafted mark.drafted").count() > 0, stats
            assert page.locator("#out-plain mark.drafted").count() == 0
            assert (
                "0 from drafts · 1.00 tokens per verify"
                in page.locator("#stats-plain").inner_text()
            )
            page.screenshot(path=str(shots / "console-compare.png"))

            # rounds: the share changed from the page, the charts updated by the polls
            page.locator("#tab-compare").press("ArrowRight")  # the tabs move by keyboard
            expect(page.locator("#view-rounds")).to_be_visible()
            expect(page.locator("#share-target")).to_have_text("0.50")
            page.locator("#share").fill("0.3")
            page.click("#share-apply")
            expect(page.locator("#share-status")).to_contain_text("0.30 (was 0.50)")
            expect(page.locator("#share-target")).to_have_text("0.30")
            assert server.engine.share.share == 0.3
            points = int(page.locator("#chart-tokens").get_attribute("data-points"))
            server.client(api_key=KEY).completions.create(model="tiny", prompt="z", max_tokens=6)
            page.wait_for_function(
                f"Number(document.getElementById('chart-tokens').dataset.points) > {points}",
                timeout=30_000,
            )
            page.screenshot(path=str(shots / "console-rounds.png"))
            # readable on a phone, and in dark
            page.set_viewport_size({"width": 390, "height": 844})
            page.click("#theme")
            page.click("#theme")  # auto -> light -> dark
            assert page.evaluate("document.documentElement.dataset.theme") == "dark"
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= 390, f"the page scrolls sideways on a phone ({width} px)"
            page.screenshot(path=str(shots / "console-rounds-phone-dark.png"), full_page=True)
            assert not errors, errors
        finally:
            browser.close()
            server.post("/v1/lanes/prefill_share", {"prefill_share": 0.5},
                        {"Authorization": f"Bearer {KEY}"})  # fmt: skip
