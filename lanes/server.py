"""The OpenAI-compatible HTTP server: a starlette app over the AsyncEngine."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor

from prometheus_client import generate_latest
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from lanes import __version__
from lanes.async_engine import (
    Aborted,
    AsyncEngine,
    Delta,
    Failed,
    Finished,
    RequestHandle,
    ShuttingDown,
)
from lanes.chat import takes_tools
from lanes.engine import Engine
from lanes.openai_api import (
    ApiError,
    ParsedRequest,
    chat_logprobs,
    check_context,
    completion_logprobs,
    decode_body,
    parse_request,
    refuse_control_tokens,
    usage,
)
from lanes.server_metrics import ServerMetrics, finish_reason
from lanes.tools import ToolCallStream
from lanes.utility_api import detokenize, model_card, tokenize, version

log = logging.getLogger("lanes")

MAX_BODY_BYTES = 4 * 2**20
BODY_TIMEOUT_S = 30.0  # a client gets this long to send its whole request body
# Threads that parse bodies, tokenize and compile grammars: a burst of big requests queues here,
# beside the event loop (/health, streams) and the engine thread rather than in their way.
INTAKE_THREADS = 4


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


def build_app(
    engine: Engine,
    model_name: str | Sequence[str],
    api_key: str | Sequence[str] | None = None,
    *,
    allow_special_tokens: bool = False,
    body_timeout: float = BODY_TIMEOUT_S,
    allowed_origins: tuple[str, ...] = (),
    log_requests: bool = True,
    report_cached_tokens: bool = False,
) -> Starlette:
    """The app. model_name: the id clients send, or several (vLLM's --served-model-name a b):
    any is accepted and echoed back, the first labels the metrics. api_key: one key or several;
    each key's requests see only the prompt cache entries of that key. allowed_origins: the
    browser origins CORS lets in (none unless given: a web page must not drive a loopback
    server). log_requests: a log line per request as it ends (id, outcome, tokens, TTFT,
    duration). report_cached_tokens: usage.prompt_tokens_details.cached_tokens in responses
    (vLLM's --enable-prompt-tokens-details); off by default, as it tells a client which prompt
    prefixes others sent (docs/serving.md)."""
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"model names must be non-empty strings, got {model_name!r}")
    model_name = names[0]
    served = ", ".join(repr(n) for n in names)
    runner = AsyncEngine(engine)
    metrics = ServerMetrics(model_name)
    control_tokens = [] if allow_special_tokens else engine.tokenizer.control_tokens
    keys = (api_key,) if isinstance(api_key, str) else tuple(api_key or ())
    intake = ThreadPoolExecutor(INTAKE_THREADS, thread_name_prefix="lanes-intake")

    async def off_loop(call, *args):
        """call(*args) on an intake thread."""
        return await asyncio.get_running_loop().run_in_executor(intake, call, *args)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        runner.start()
        try:
            yield
        finally:
            await asyncio.to_thread(runner.stop)
            intake.shutdown(wait=False, cancel_futures=True)

    def check_key(request: Request) -> str:
        """The prompt-cache salt of the request's key ("" without keys), or a 401."""
        if not keys:
            return ""
        given = request.headers.get("authorization", "").encode()
        matched = [k for k in keys if hmac.compare_digest(given, f"Bearer {k}".encode())]
        if not matched:
            raise ApiError("invalid or missing API key", status=401, kind="authentication_error")
        return key_salt(matched[0])

    async def read_json(request: Request) -> dict:
        kind = request.headers.get("content-type")
        media = (kind or "application/json").split(";")[0].strip().lower()
        if media != "application/json" and not media.endswith("+json"):
            raise ApiError(f"Content-Type must be application/json, not {kind[:60]!r}", status=415)
        try:
            size = int(request.headers.get("content-length") or 0)
        except ValueError as e:
            raise ApiError("Content-Length is not a number") from e
        if size > MAX_BODY_BYTES:
            raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)

        async def read() -> bytes:
            raw = bytearray()
            async for chunk in request.stream():
                raw += chunk
                if len(raw) > MAX_BODY_BYTES:
                    raise ApiError(f"request body over {MAX_BODY_BYTES} bytes", status=413)
            return bytes(raw)

        try:
            raw = await asyncio.wait_for(read(), body_timeout)
        except TimeoutError as e:
            raise ApiError(f"the request body took over {body_timeout:g} s", status=408) from e
        return await off_loop(decode_body, raw)  # up to 4 MiB: off the event loop

    async def completions(request: Request) -> Response:
        return await handle(request, chat=False)

    async def chat_completions(request: Request) -> Response:
        return await handle(request, chat=True)

    def lanes_for(parsed: ParsedRequest, chat: bool, salt: str) -> list:
        """Every choice's lane, validated and tokenized (off the event loop and the engine)."""
        if chat:
            refuse_control_tokens(parsed.prompts[0], control_tokens)
        salt += parsed.cache_salt
        per_choice = [(p, params, salt) for p in parsed.prompts for params in parsed.params]
        lanes = runner.make_lanes(per_choice)
        if parsed.max_tokens_given:
            for lane in lanes:
                check_context(len(lane.prompt_ids), lane.params.max_tokens, engine.context_len)
        return lanes

    async def handle(request: Request, chat: bool) -> Response:
        try:
            salt = check_key(request)
            body = await read_json(request)
            wanted = body.get("model")
            if wanted is not None and wanted not in names:
                raise ApiError(
                    f"model {str(wanted)[:100]!r} is not served here; this server has {served}",
                    "model",
                    404,
                    "not_found_error",
                )
            native = takes_tools(engine.tokenizer.chat_template)
            parsed = parse_request(body, chat, engine.context_len, native)
            lanes = await off_loop(lanes_for, parsed, chat, salt)
            handles = runner.submit_lanes(lanes)  # all at once: cancelled together, too
        except ApiError as e:
            return error_response(e)
        except ValueError as e:  # RequestError, chat template errors: this request's input
            return error_response(ApiError(str(e)))
        except ShuttingDown as e:
            return error_response(ApiError(str(e), status=503, kind="server_error"))
        except Exception:  # a bug met while taking this request in: it alone fails
            log.exception("taking a request failed")
            message = "internal error while taking the request; the server log has the details"
            return error_response(ApiError(message, status=500, kind="server_error"))
        ctx = _Context(
            chat,
            parsed,
            handles,
            model_name if wanted is None else wanted,  # echoed, as vLLM does
            engine.tokenizer,
            metrics,
            engine.fingerprint,
            log_requests,
            report_cached_tokens,
        )
        if parsed.stream:
            return StreamingResponse(ctx.sse(), media_type="text/event-stream")
        return await ctx.whole(request)

    async def models(request: Request) -> Response:
        try:
            check_key(request)
        except ApiError as e:
            return error_response(e)
        return JSONResponse(
            {"object": "list", "data": [model_card(n, engine.context_len) for n in names]}
        )

    async def model_by_id(request: Request) -> Response:
        try:
            check_key(request)
            wanted = request.path_params["model_id"]
            if wanted not in names:
                raise ApiError(
                    f"model {wanted[:100]!r} is not served here; this server has {served}",
                    "model",
                    404,
                    "not_found_error",
                )
        except ApiError as e:
            return error_response(e)
        return JSONResponse(model_card(wanted, engine.context_len))

    async def json_utility(request: Request, answer) -> Response:
        """A utility endpoint: the key checked, the JSON body read, answer(body) off the loop."""
        try:
            check_key(request)
            body = await read_json(request)
            out = await off_loop(answer, body)
        except ApiError as e:
            return error_response(e)
        except Exception:  # a bug met on this body: it alone fails, as JSON
            log.exception("%s failed", request.url.path)
            message = "internal error; the server log has the details"
            return error_response(ApiError(message, status=500, kind="server_error"))
        return JSONResponse(out)

    async def tokenize_route(request: Request) -> Response:
        tok, limit = engine.tokenizer, engine.context_len
        return await json_utility(request, lambda b: tokenize(b, tok, limit, control_tokens))

    async def detokenize_route(request: Request) -> Response:
        return await json_utility(request, lambda b: detokenize(b, engine.tokenizer))

    async def version_route(request: Request) -> Response:
        return JSONResponse(version())

    async def health(request: Request) -> Response:
        if not runner.alive:
            return JSONResponse({"status": "engine not running"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def debug_kv(request: Request) -> Response:
        return JSONResponse(runner.snapshot())

    async def prometheus(request: Request) -> Response:
        report = runner.snapshot()
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
        g["engine_alive"].set(1.0 if runner.alive else 0.0)
        metrics.engine_report.report = report
        return Response(generate_latest(metrics.registry), media_type="text/plain; version=0.0.4")

    async def http_error(request: Request, e: HTTPException) -> Response:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        path = request.url.path
        path = path if len(path) <= 80 else path[:80] + "..."  # a 1 MB path is not echoed
        message = f"{request.method} {path}: {e.detail}"
        return error_response(ApiError(message, status=e.status_code, kind=kind))

    async def server_error(request: Request, e: Exception) -> Response:
        log.error("unhandled error in %s %s", request.method, request.url.path, exc_info=e)
        return error_response(ApiError("internal server error", status=500, kind="server_error"))

    app = Starlette(
        routes=[
            Route("/v1/completions", completions, methods=["POST"]),
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model_by_id, methods=["GET"]),
            Route("/tokenize", tokenize_route, methods=["POST"]),
            Route("/detokenize", detokenize_route, methods=["POST"]),
            Route("/version", version_route, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/debug/kv", debug_kv, methods=["GET"]),
        ],
        exception_handlers={HTTPException: http_error, Exception: server_error},
        lifespan=lifespan,
        middleware=[Middleware(RequestIdHeader)]
        + (
            [
                Middleware(
                    CORSMiddleware,
                    allow_origins=list(allowed_origins),
                    allow_methods=["*"],
                    allow_headers=["*"],
                )
            ]
            if allowed_origins
            else []
        ),
    )
    app.state.runner = runner
    return app


def key_salt(api_key: str) -> str:
    """The prompt-cache salt of one API key: a digest, so the key itself is never hashed into
    block keys or kept beside them. A request's own cache_salt is added to it."""
    return "key:" + hashlib.sha256(api_key.encode()).hexdigest()[:32] + ":"


class RequestIdHeader:
    """Every response carries an X-Request-Id: the client's own, or a new one (as vLLM's
    --enable-request-id-headers does), so a client's log line can be found in ours."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"x-request-id", b"")[:128]
        request_id = given or uuid.uuid4().hex.encode()

        async def with_id(message) -> None:
            if message["type"] == "http.response.start":
                message.setdefault("headers", [])
                message["headers"] = [*message["headers"], (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, with_id)


class _Context:
    """One HTTP request's choices: streamed as SSE chunks, or gathered into one response."""

    def __init__(
        self,
        chat,
        parsed: ParsedRequest,
        handles,
        model_name,
        tokenizer,
        metrics,
        fingerprint,
        log_requests: bool = False,
        report_cached_tokens: bool = False,
    ):
        self.chat, self.parsed, self.handles = chat, parsed, handles
        self.model, self.tokenizer, self.metrics = model_name, tokenizer, metrics
        self.log_requests = log_requests
        self.report_cached_tokens = report_cached_tokens
        self.started = time.perf_counter()
        # each choice's end: its Completion, "error", or "abort" (the client left, or shutdown)
        self._outcomes: dict[int, object] = {}
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.object = "chat.completion" if chat else "text_completion"
        self._counted: set[int] = set()  # choices already in lanes_requests_total
        self._text_offsets: dict[int, int] = {}  # choice -> characters streamed so far
        # which build and weights answered (OpenAI's field; changes when either does)
        self.fingerprint = f"lanes-{__version__}-{fingerprint[:12]}"

    def _count(self, i: int, event: Finished | Failed | Aborted | None) -> None:
        """Each choice once in the request metrics: as it ended, or as aborted if the client
        left first."""
        if i in self._counted:
            return
        self._counted.add(i)
        if isinstance(event, Finished):
            self.metrics.observe(self.handles[i].prompt_len, event.completion)
            self._outcomes[i] = event.completion
        else:
            self._outcomes[i] = "error" if isinstance(event, Failed) else "abort"
            self.metrics.requests.labels(self._outcomes[i]).inc()
        if len(self._counted) == len(self.handles) and self.log_requests:
            self._log_request()

    def _log_request(self) -> None:
        """One line per request once every choice has ended."""
        ended = [self._outcomes[i] for i in range(len(self.handles))]
        done = {i: c for i, c in enumerate(ended) if not isinstance(c, str)}
        outcome = "error" if "error" in ended else "aborted" if "abort" in ended else "ok"
        tokens = self._finish(done, for_client=False)  # the response's usage, and cached
        ttfts = [c.ttft for c in done.values() if c.ttft is not None]
        log.info(
            "request %s: %s | %d choice%s | prompt %d tokens (%d cached) | completion %d tokens "
            "| TTFT %s | %.3f s | finish %s",
            self.id,
            outcome,
            len(ended),
            "" if len(ended) == 1 else "s",
            tokens["prompt_tokens"],
            tokens["prompt_tokens_details"]["cached_tokens"],
            tokens["completion_tokens"],
            f"{min(ttfts):.3f} s" if ttfts else "-",
            time.perf_counter() - self.started,
            ",".join(sorted({finish_reason(c) for c in done.values()})) or "-",
        )

    async def _events(self) -> AsyncIterator[tuple[int, object]]:
        """(choice index, event) from every choice, as they come; ends when all are finished."""
        merged: asyncio.Queue = asyncio.Queue()

        async def pump(i: int, h: RequestHandle) -> None:
            while True:
                event = await h.next_event()
                await merged.put((i, event))
                if isinstance(event, Finished | Failed | Aborted):
                    return

        tasks = [asyncio.create_task(pump(i, h)) for i, h in enumerate(self.handles)]
        try:
            for _ in range(sum(1 for _ in self.handles)):
                while True:
                    i, event = await merged.get()
                    if isinstance(event, Finished | Failed | Aborted):
                        self._count(i, event)
                    yield i, event
                    if isinstance(event, Finished | Failed | Aborted):
                        break
        finally:
            for t in tasks:
                t.cancel()
            for i, h in enumerate(self.handles):  # a no-op for finished requests
                h.cancel()
                self._count(i, None)

    def _finish(self, completions: dict[int, object], for_client: bool = True) -> dict:
        """The usage of these choices; cached_tokens for the client only where the server
        reports them (report_cached_tokens), always for the log."""
        done = list(completions.values())
        prompt_tokens = sum(h.prompt_len for h in self.handles[:: len(self.parsed.params)])
        cached = sum(
            c.cached_tokens for i, c in completions.items() if i % len(self.parsed.params) == 0
        )
        out = usage(prompt_tokens, done, cached)
        if for_client and not self.report_cached_tokens:
            out["prompt_tokens_details"] = None
        return out

    def _logprobs(self, i: int, token_ids, logprobs, top, streamed: bool = False) -> dict | None:
        if self.parsed.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, token_ids, logprobs, top)
        start = self._text_offsets.get(i, 0) if streamed else 0
        out = completion_logprobs(self.tokenizer, token_ids, logprobs, top, start)
        if streamed:  # the next chunk's offsets go on from here
            self._text_offsets[i] = start + sum(len(t) for t in out["tokens"])
        return out

    @staticmethod
    def _failure(event: Failed) -> ApiError:
        if isinstance(event.error, ShuttingDown):
            return ApiError(str(event.error), status=503, kind="server_error")
        return ApiError(
            f"{event.error}; the server log has the details", status=500, kind="server_error"
        )

    async def whole(self, request: Request) -> Response:
        completions: dict[int, object] = {}
        watcher = asyncio.create_task(self._watch_disconnect(request))
        try:
            async for i, event in self._events():
                if isinstance(event, Failed):
                    return error_response(self._failure(event))
                if isinstance(event, Aborted):
                    message = "the server is shutting down"
                    return error_response(ApiError(message, status=503, kind="server_error"))
                if isinstance(event, Finished):
                    completions[i] = event.completion
        finally:
            watcher.cancel()
        choices = []
        for i in sorted(completions):
            c = completions[i]
            lp = self._logprobs(i, c.token_ids, c.logprobs, c.top_logprobs)
            if self.chat:
                message, reason = self._message(c)
                choices.append(
                    {"index": i, "message": message, "logprobs": lp, "finish_reason": reason}
                )
            else:
                choices.append(
                    {"index": i, "text": c.text, "logprobs": lp, "finish_reason": finish_reason(c)}
                )
        body = {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": self._finish(completions),
        }
        return JSONResponse(body)

    def _message(self, c) -> tuple[dict, str]:
        """A chat choice's message and finish_reason: with tools, the <tool_call> blocks of its
        text become tool_calls (finish_reason "tool_calls")."""
        reason = finish_reason(c)
        tools = self.parsed.tools
        content, calls = tools.parse(c.text) if tools is not None else (c.text, [])
        if not calls:
            return {"role": "assistant", "content": c.text}, reason
        return (
            {"role": "assistant", "content": content, "tool_calls": calls},
            "tool_calls" if reason == "stop" else reason,
        )

    def _tool_delta(self, i: int, content: str, calls: list) -> str:
        """A chunk of a chat with tools: content as it comes, tool_calls deltas (a call's
        header, then pieces of its arguments) as ToolCallStream makes them."""
        d: dict = {"content": content} if content else {}
        if calls:
            d["tool_calls"] = calls
        return self._chunk([{"index": i, "delta": d, "logprobs": None, "finish_reason": None}])

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
            "system_fingerprint": self.fingerprint,
            "choices": choices,
        }
        if usage_ is not None:
            body["usage"] = usage_
        return f"data: {json.dumps(body)}\n\n"

    def _last_chunk(self, i: int, reason: str) -> str:
        """The chunk that ends choice i: no new text, its finish_reason."""
        empty = {"delta": {}} if self.chat else {"text": ""}
        return self._chunk([{"index": i, **empty, "logprobs": None, "finish_reason": reason}])

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
        tools = self.parsed.tools  # with tools: the <tool_call> blocks become tool_calls
        streams = {i: ToolCallStream(tools) for i in range(len(self.handles))} if tools else {}
        async for i, event in self._events():
            if isinstance(event, Delta) and streams:
                content, calls = streams[i].feed(event.text)
                if content or calls:
                    yield self._tool_delta(i, content, calls)
            elif isinstance(event, Delta):
                lp = self._logprobs(
                    i, event.token_ids, event.logprobs, event.top_logprobs, streamed=True
                )
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
                reason = finish_reason(event.completion)
                if streams:
                    rest = streams[i].flush()
                    if rest:
                        yield self._tool_delta(i, rest, [])
                    if streams[i].num_calls and reason == "stop":
                        reason = "tool_calls"
                yield self._last_chunk(i, reason)
            elif isinstance(event, Aborted):
                yield self._last_chunk(i, "abort")
            elif isinstance(event, Failed):  # the choice ends "error", then the error itself
                yield self._last_chunk(i, "error")
                yield f"data: {json.dumps(self._failure(event).body())}\n\n"
                yield "data: [DONE]\n\n"
                return
        total = self._finish(completions)
        if self.parsed.include_usage:
            yield self._chunk([], total)
        yield "data: [DONE]\n\n"
