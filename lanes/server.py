"""The OpenAI-compatible HTTP server: a starlette app over the AsyncEngine."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from cache.block_pool import IntegrityError
from lanes.async_engine import AsyncEngine, Delta, Failed, Finished, RequestHandle
from lanes.engine import Engine, RequestError
from lanes.metrics import peak_memory_bytes
from lanes.openai_api import (
    ApiError,
    ParsedRequest,
    chat_logprobs,
    completion_logprobs,
    parse_request,
    usage,
)

MAX_BODY_BYTES = 4 * 2**20
_LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class ServerMetrics:
    """Prometheus series, in a registry of the app's own."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "lanes_requests", "Finished requests", ["finish_reason"], registry=r
        )
        self.prompt_tokens = Counter(
            "lanes_prompt_tokens", "Prompt tokens of finished requests", registry=r
        )
        self.cached_tokens = Counter(
            "lanes_cached_prompt_tokens", "Prompt tokens served from the prompt cache", registry=r
        )
        self.generated = Counter("lanes_generation_tokens", "Generated tokens", registry=r)
        self.ttft = Histogram(
            "lanes_time_to_first_token_seconds", "TTFT", buckets=_LATENCY_BUCKETS, registry=r
        )
        self.itl = Histogram(
            "lanes_inter_token_latency_seconds",
            "Inter-token latency",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.gauges = {
            name: Gauge(f"lanes_{name}", doc, registry=r)
            for name, doc in {
                "draft_acceptance_rate": "Kept draft tokens / verified draft tokens",
                "prefill_share": "Achieved share of wall time for prompt work (recent mixed rounds)",
                "prompt_cache_bytes": "Bytes of KV held by the prompt cache",
                "prompt_cache_blocks": "Blocks held by the prompt cache",
                "active_lanes": "Lanes in FILL or DECODE",
                "waiting_lanes": "Requests queued for a lane",
                "kv_blocks_used": "KV blocks in use (lanes and prompt cache)",
                "kv_blocks_total": "KV blocks in the pool",
                "kv_integrity_ok": "1 if the block bookkeeping checks out",
                "peak_memory_bytes": "Peak GPU memory allocated (CUDA), else peak resident set",
            }.items()
        }

    def observe(self, prompt_len: int, completion) -> None:
        self.requests.labels(completion.finish_reason).inc()
        self.prompt_tokens.inc(prompt_len)
        self.cached_tokens.inc(completion.cached_tokens)
        self.generated.inc(len(completion.token_ids))
        if completion.ttft is not None:
            self.ttft.observe(completion.ttft)
        times = completion.token_times
        for a, b in zip(times, times[1:], strict=False):
            self.itl.observe(b - a)


def kv_report(engine: Engine) -> dict:
    """Block bookkeeping, computed on the engine thread between rounds."""
    try:
        engine.check_integrity()
        integrity = "ok"
    except IntegrityError as e:
        integrity = str(e)
    owned = {b for lane in engine.running for b in lane.block_table.blocks}
    return {
        "blocks_total": engine.pool.num_blocks,
        "blocks_free": engine.pool.num_free,
        "blocks_cached": engine.cache.num_cached,
        "blocks_owned_by_lanes": len(owned),
        "active_lanes": len(engine.running),
        "waiting_lanes": len(engine.waiting),
        "integrity": integrity,
        "draft_acceptance_rate": engine.metrics.acceptance_rate,
        "prefill_share": engine.metrics.achieved_prefill_share,
        "prompt_cache_bytes": engine.cache.num_cached * engine.bytes_per_block,
        "peak_memory_bytes": peak_memory_bytes(engine.config.device),
    }


def build_app(engine: Engine, model_name: str, api_key: str | None = None) -> Starlette:
    runner = AsyncEngine(engine)
    metrics = ServerMetrics()

    @contextlib.asynccontextmanager
    async def lifespan(app):
        runner.start()
        try:
            yield
        finally:
            await asyncio.to_thread(runner.stop)

    def check_key(request: Request) -> None:
        if api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
            raise ApiError("invalid or missing API key", status=401, kind="authentication_error")

    async def read_json(request: Request) -> dict:
        if int(request.headers.get("content-length") or 0) > MAX_BODY_BYTES:
            raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
        raw = b""
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(f"the request body is not valid JSON: {e}") from e

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    async def handle(request: Request, chat: bool) -> Response:
        handles: list[RequestHandle] = []
        try:
            check_key(request)
            body = await read_json(request)
            if body.get("model") not in (model_name, None):
                raise ApiError(
                    f"model {body.get('model')!r} is not served here; this server has {model_name!r}",
                    "model",
                    404,
                    "not_found_error",
                )
            parsed = parse_request(body, chat, engine.context_len)
            for prompt in parsed.prompts:
                for params in parsed.params:
                    handles.append(await runner.submit(prompt, params, parsed.cache_salt))
        except (ApiError, RequestError) as e:
            for h in handles:
                h.cancel()
            err = e if isinstance(e, ApiError) else ApiError(str(e))
            return JSONResponse(err.body(), status_code=err.status)
        ctx = _Context(chat, parsed, handles, model_name, engine.tokenizer, metrics)
        if parsed.stream:
            return StreamingResponse(ctx.sse(), media_type="text/event-stream")
        return await ctx.whole(request)

    async def models(request: Request) -> Response:
        try:
            check_key(request)
        except ApiError as e:
            return JSONResponse(e.body(), status_code=e.status)
        model = {
            "id": model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "lanes",
            "max_model_len": engine.context_len,
        }
        return JSONResponse({"object": "list", "data": [model]})

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def debug_kv(request: Request) -> Response:
        return JSONResponse(await runner.call(kv_report))

    async def prometheus(request: Request) -> Response:
        report = await runner.call(kv_report)
        g = metrics.gauges
        g["draft_acceptance_rate"].set(report["draft_acceptance_rate"] or 0.0)
        g["prefill_share"].set(report["prefill_share"] or 0.0)
        g["prompt_cache_bytes"].set(report["prompt_cache_bytes"])
        g["prompt_cache_blocks"].set(report["blocks_cached"])
        g["active_lanes"].set(report["active_lanes"])
        g["waiting_lanes"].set(report["waiting_lanes"])
        g["kv_blocks_used"].set(report["blocks_total"] - report["blocks_free"])
        g["kv_blocks_total"].set(report["blocks_total"])
        g["kv_integrity_ok"].set(1.0 if report["integrity"] == "ok" else 0.0)
        g["peak_memory_bytes"].set(report["peak_memory_bytes"])
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/debug/kv", debug_kv, methods=["GET"]),
        ],
        lifespan=lifespan,
    )
    app.state.runner = runner
    return app


class _Context:
    """One HTTP request's choices: streamed as SSE chunks, or gathered into one response."""

    def __init__(self, chat, parsed: ParsedRequest, handles, model_name, tokenizer, metrics):
        self.chat, self.parsed, self.handles = chat, parsed, handles
        self.model, self.tokenizer, self.metrics = model_name, tokenizer, metrics
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"

    async def _events(self) -> AsyncIterator[tuple[int, object]]:
        """(choice index, event) from every choice, as they come; ends when all are finished."""
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, h: RequestHandle) -> None:
            while True:
                event = await h.next_event()
                await merged.put((i, event))
                if isinstance(event, Finished | Failed):
                    return

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(self.handles)]
        try:
            for _ in range(sum(1 for _ in self.handles)):
                while True:
                    i, event = await merged.get()
                    yield i, event
                    if isinstance(event, Finished | Failed):
                        break
        finally:
            for t in tasks:
                t.cancel()
            for h in self.handles:  # a no-op for finished requests; cancels the rest
                h.cancel()

    def _finish(self, completions: dict[int, object]) -> dict:
        done = list(completions.values())
        for i, c in completions.items():
            self.metrics.observe(self.handles[i].prompt_len, c)
        prompt_tokens = sum(h.prompt_len for h in self.handles[:: len(self.parsed.params)])
        cached = sum(
            c.cached_tokens for i, c in completions.items() if i % len(self.parsed.params) == 0
        )
        return usage(prompt_tokens, done, cached)

    def _logprobs(self, token_ids, logprobs, top) -> dict | None:
        if self.parsed.logprobs is None:
            return None
        build = chat_logprobs if self.chat else completion_logprobs
        return build(self.tokenizer, token_ids, logprobs, top)

    @staticmethod
    def _reason(completion) -> str:
        return "abort" if completion.finish_reason == "cancelled" else completion.finish_reason

    async def whole(self, request: Request) -> Response:
        completions: dict[int, object] = {}
        watcher = asyncio.create_task(self._watch_disconnect(request))
        try:
            async for i, event in self._events():
                if isinstance(event, Failed):
                    return JSONResponse(
                        ApiError(
                            f"generation failed: {event.error}", status=500, kind="server_error"
                        ).body(),
                        status_code=500,
                    )
                if isinstance(event, Finished):
                    completions[i] = event.completion
        finally:
            watcher.cancel()
        choices = []
        for i in sorted(completions):
            c = completions[i]
            lp = self._logprobs(c.token_ids, c.logprobs, c.top_logprobs)
            if self.chat:
                choices.append(
                    {
                        "index": i,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": lp,
                        "finish_reason": self._reason(c),
                    }
                )
            else:
                choices.append(
                    {"index": i, "text": c.text, "logprobs": lp, "finish_reason": self._reason(c)}
                )
        body = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self._finish(completions),
        }
        return JSONResponse(body)

    async def _watch_disconnect(self, request: Request) -> None:
        while not await request.is_disconnected():
            await asyncio.sleep(0.05)
        for h in self.handles:
            h.cancel()

    def _chunk(self, choices: list, usage_: dict | None = None) -> str:
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_ is not None:
            body["usage"] = usage_
        return f"data: {json.dumps(body)}\n\n"

    async def sse(self) -> AsyncIterator[str]:
        completions: dict[int, object] = {}
        if self.chat:
            yield self._chunk(
                [
                    {
                        "index": i,
                        "delta": {"role": "assistant", "content": ""},
                        "logprobs": None,
                        "finish_reason": None,
                    }
                    for i in range(len(self.handles))
                ]
            )
        async for i, event in self._events():
            if isinstance(event, Delta):
                lp = self._logprobs(event.token_ids, event.logprobs, event.top_logprobs)
                if self.chat:
                    choice = {
                        "index": i,
                        "delta": {"content": event.text},
                        "logprobs": lp,
                        "finish_reason": None,
                    }
                else:
                    choice = {"index": i, "text": event.text, "logprobs": lp, "finish_reason": None}
                yield self._chunk([choice])
            elif isinstance(event, Finished):
                completions[i] = event.completion
                key = "delta" if self.chat else "text"
                yield self._chunk(
                    [
                        {
                            "index": i,
                            key: {} if self.chat else "",
                            "logprobs": None,
                            "finish_reason": self._reason(event.completion),
                        }
                    ]
                )
            elif isinstance(event, Failed):
                yield f"data: {json.dumps(ApiError(f'generation failed: {event.error}', status=500, kind='server_error').body())}\n\n"
                return
        total = self._finish(completions)
        if self.parsed.include_usage:
            yield self._chunk([], total)
        yield "data: [DONE]\n\n"
