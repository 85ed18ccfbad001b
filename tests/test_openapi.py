"""/openapi.json from the request models (lanes/request_models.py): every field docs/serving.md
documents is declared there, and a field the model does not declare is what a request gets
warned about."""

from __future__ import annotations

import json
import re
from pathlib import Path

from lanes import build_engine
from lanes.request_models import ChatCompletionRequest, CompletionRequest, unknown_fields
from tests.live_server import LiveServer

DOCS = Path(__file__).parents[1] / "docs" / "serving.md"


def _documented() -> set[str]:
    table = DOCS.read_text().split("## Request fields", 1)[1].split("\n\n", 2)[1]
    rows = [line.split("|")[1] for line in table.splitlines()[2:] if line.startswith("|")]
    return {n.split(".")[0] for row in rows for n in re.findall(r"`([a-z_.]+)`", row)}


def test_openapi_lists_every_documented_field(llama_dir):
    with LiveServer(build_engine(str(llama_dir))) as live:
        doc = json.loads(live.get("/openapi.json"))
    assert doc["openapi"].startswith("3.1") and set(doc["paths"]) == {
        "/v1/completions", "/v1/chat/completions", "/v1/responses"}  # fmt: skip
    schemas = doc["components"]["schemas"]
    declared = set(schemas["CompletionRequest"]["properties"]) | set(
        schemas["ChatCompletionRequest"]["properties"]
    )
    assert _documented() <= declared, _documented() - declared
    assert schemas["CompletionRequest"]["required"] == ["prompt"]


def test_unknown_fields_are_the_ones_the_model_lacks():
    body = {"model": "m", "prompt": "x", "echo": True, "frobnicate": 1, "messages": []}
    assert unknown_fields(body, CompletionRequest) == ["frobnicate", "messages"]
    assert unknown_fields(body, ChatCompletionRequest) == ["echo", "frobnicate", "prompt"]
