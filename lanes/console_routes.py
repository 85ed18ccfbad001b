"""The lanes console's routes: the page itself (static files in the package, no build step, no
CDN) and the two endpoints it adds to the API, both behind the API key like every data route:

- GET /v1/lanes/rounds?after=N: the rounds the engine ran after round N (at most
  MAX_ROUNDS of them; the engine keeps its last 1,024), with the share target, lanes, KV and
  prompt-cache use, draft counts, and the latest finished requests' TTFT and inter-token latency.
- GET / POST /v1/lanes/prefill_share: the share of wall time prompt work gets when decode also
  waits (--prefill-share), read or set for the rounds planned from now on. It moves prompt
  chunks between rounds; outputs stay the same token for token (lanes' rows are batch-invariant).

The page is served without a key (it holds no data, as /health and /openapi.json); it asks for
the key and sends it with every request it makes.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from lanes.openai_api import ApiError
from lanes.responses import error_response

MAX_ROUNDS = 256  # rounds per answer: a page polling every second keeps up with ~250 rounds/s
_ASSETS = {  # the page's files, by the name it asks for, and their media types
    "console.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
}


def _asset(name: str) -> bytes:
    return (resources.files("lanes") / "console" / name).read_bytes()


def rounds_after(engine, after: int) -> dict:
    """The rounds and engine state the rounds view charts; on the engine thread."""
    m = engine.metrics
    first = m.num_rounds - len(m.recent)  # the index of the oldest round still kept
    start = max(after, first, m.num_rounds - MAX_ROUNDS)
    kept = list(m.recent)[start - first :]
    rounds = [
        {
            "index": start + j,
            "prefill_tokens": r.prefill_tokens,
            "decode_tokens": r.decode_tokens,
            "seconds": r.seconds,
            "prefill_share": r.prefill_share,
            "drafts": r.drafts,
            "device_round": r.device_round,
        }
        for j, r in enumerate(kept)
    ]
    return {
        "rounds": rounds,
        "next": m.num_rounds,  # ask with after=next for the rounds after these
        "prefill_share_target": engine.share.share,
        "achieved_prefill_share": m.achieved_prefill_share,
        "running_lanes": len(engine.running),
        "waiting_lanes": len(engine.waiting),
        "kv_blocks_used": engine.pool.num_blocks - engine.pool.num_free,
        "kv_blocks_total": engine.pool.num_blocks,
        "prompt_cache_blocks": engine.cache.num_cached,
        "draft_tokens": m.num_drafted,
        "accepted_draft_tokens": m.num_accepted,
        "verify_steps": m.num_verify_steps,
    }


def console_routes(runner, check_key: Callable, read_json: Callable, metrics) -> list:
    """The routes, over the server's AsyncEngine, its key check (raises ApiError), its JSON body
    reader (limits and content type as every route's) and its ServerMetrics."""

    async def page(request: Request) -> Response:
        return Response(_asset("console.html"), media_type=_ASSETS["console.html"])

    async def asset(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in _ASSETS:
            return error_response(
                ApiError(f"no console file {name[:80]!r}", status=404, kind="not_found_error")
            )
        return Response(_asset(name), media_type=_ASSETS[name])

    async def rounds(request: Request) -> Response:
        try:
            check_key(request)
            after = request.query_params.get("after", "0")
            if not (after.isascii() and after.isdigit()) or len(after) > 18:
                raise ApiError("'after' must be a round index (a non-negative integer)", "after")
            out = await runner.call(lambda e: rounds_after(e, int(after)))
        except ApiError as e:
            return error_response(e)
        out["latencies"] = list(metrics.recent_latencies)
        return JSONResponse(out)

    async def prefill_share(request: Request) -> Response:
        try:
            check_key(request)
            if request.method == "GET":
                return JSONResponse({"prefill_share": await runner.call(lambda e: e.share.share)})
            body = await read_json(request)
            share = body.get("prefill_share") if isinstance(body, dict) else None
            if isinstance(share, bool) or not isinstance(share, int | float):
                raise ApiError("'prefill_share' must be a number in [0, 1]", "prefill_share")
            if not 0.0 <= share <= 1.0:
                raise ApiError(f"'prefill_share' must be in [0, 1], got {share}", "prefill_share")
            previous = await runner.call(lambda e: e.share.set_share(float(share)))
        except ApiError as e:
            return error_response(e)
        return JSONResponse({"prefill_share": float(share), "previous": previous})

    return [
        Route("/", page, methods=["GET"]),
        Route("/console/{name}", asset, methods=["GET"]),
        Route("/v1/lanes/rounds", rounds, methods=["GET"]),
        Route("/v1/lanes/prefill_share", prefill_share, methods=["GET", "POST"]),
    ]
