"""The OpenAI-compatible HTTP server: a starlette app over the AsyncEngine."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import logging
import uuid
from collections.abc import Sequence
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
    AsyncEngine,
    ShuttingDown,
)
from lanes.chat import takes_tools
from lanes.console_routes import console_routes
from lanes.engine import Engine
from lanes.openai_api import (
    ApiError,
    ParsedRequest,
    check_context,
    decode_body,
    parse_request,
    refuse_control_tokens,
)
from lanes.prompt_scores import score_prompts
from lanes.reasoning import opens_in_prompt, template_thinks
from lanes.request_models import openapi
from lanes.responses import RequestContext, error_response
from lanes.responses_api import ResponsesRequest, chat_body
from lanes.server_metrics import ServerMetrics
from lanes.tool_formats import format_of
from lanes.utility_api import detokenize, model_card, tokenize, version

log = logging.getLogger("lanes")

MAX_BODY_BYTES = 4 * 2**20
BODY_TIMEOUT_S = 30.0  # a client gets this long to send its whole request body
MAX_WARNED_FIELDS = 256  # unknown request field names logged (once each)
# Threads that parse bodies, tokenize and compile grammars: a burst of big requests queues here,
# beside the event loop (/health, streams) and the engine thread rather than in their way.
INTAKE_THREADS = 4


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
    max_logprobs: int = 20,
    log_stats: bool = True,
    reasoning_parser: str | None = None,
    tool_call_parser: str | None = None,
) -> Starlette:
    """The app. model_name: the id clients send, or several (vLLM's --served-model-name a b):
    any is accepted and echoed back, the first labels the metrics. api_key: one key or several;
    each key's requests see only the prompt cache entries of that key. allowed_origins: the
    browser origins CORS lets in (none unless given: a web page must not drive a loopback
    server). log_requests: a log line per request as it ends (id, outcome, tokens, TTFT,
    duration). report_cached_tokens: usage.prompt_tokens_details.cached_tokens in responses
    (vLLM's --enable-prompt-tokens-details); off by default, as it tells a client which prompt
    prefixes others sent (docs/serving.md). max_logprobs: the most logprobs / top_logprobs a
    request may ask for (vLLM's --max-logprobs). log_stats: a periodic stats line in the log.
    reasoning_parser: vLLM's --reasoning-parser ("none": off); None: on where the chat template
    writes <think> blocks (lanes/reasoning.py). tool_call_parser: vLLM's --tool-call-parser; None:
    the format the chat template writes (lanes/tool_formats.py)."""
    names = (model_name,) if isinstance(model_name, str) else tuple(model_name)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise ValueError(f"model names must be non-empty strings, got {model_name!r}")
    model_name = names[0]
    served = ", ".join(repr(n) for n in names)
    runner = AsyncEngine(engine, log_stats=log_stats)
    cfg = engine.config
    metrics = ServerMetrics(
        model_name,
        cache_info={
            "block_size": cfg.block_size,
            "num_gpu_blocks": engine.pool.num_blocks,
            "cache_dtype": cfg.torch_dtype_name,
            "enable_prefix_caching": cfg.prompt_cache_bytes > 0,
            "prompt_cache_bytes": cfg.prompt_cache_bytes,
        },
    )
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

    async def responses_route(request: Request) -> Response:
        return await handle(request, chat=True, responses=True)

    def check_model(wanted) -> None:
        if wanted is not None and wanted not in names:
            raise ApiError(
                f"model {str(wanted)[:100]!r} is not served here; this server has {served}",
                "model",
                404,
                "not_found_error",
            )

    def parse_for(body: dict, chat: bool) -> tuple[str | None, ParsedRequest]:
        """The model asked for (checked) and the parsed request."""
        wanted = body.get("model")
        check_model(wanted)
        native = takes_tools(engine.tokenizer.chat_template)
        fmt = format_of(tool_call_parser, engine.tokenizer.chat_template)
        return wanted, parse_request(body, chat, engine.context_len, native, max_logprobs, fmt)

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

    warned: set[str] = set()
    if reasoning_parser is None:
        thinks = template_thinks(engine.tokenizer.chat_template)
    else:
        thinks = reasoning_parser != "none"

    def reasoning_inside(lanes) -> bool | None:
        """None: no reasoning parsing; else whether the prompt opened the reasoning block."""
        if not thinks:
            return None
        return opens_in_prompt(engine.tokenizer.decode(lanes[0].prompt_ids[-8:]))

    def warn_unknown(names: tuple[str, ...]) -> None:
        """Once per field name, as vLLM warns; a bounded number of names (they come from
        clients)."""
        for name in names:
            if name not in warned and len(warned) < MAX_WARNED_FIELDS:
                warned.add(name)
                log.warning("request field %r is not known to lanes and was ignored", name[:80])

    async def handle(request: Request, chat: bool, responses: bool = False) -> Response:
        """A completions or chat request; `responses`: a /v1/responses one, run as the chat
        request it means (lanes/responses_api.py)."""
        raw = None
        try:
            salt = check_key(request)
            body = await read_json(request)
            if responses:
                raw, body = body, chat_body(body)
            wanted, parsed = parse_for(body, chat)
            warn_unknown(parsed.unknown_fields)
            lanes = await off_loop(lanes_for, parsed, chat, salt)
            scores = None
            if parsed.echo or parsed.prompt_logprobs is not None:  # one forward per prompt
                n = len(parsed.params)
                ids = [lanes[k * n].prompt_ids for k in range(len(parsed.prompts))]
                top = max(parsed.logprobs or 0, parsed.prompt_logprobs or 0)
                scores = await runner.call(lambda e: score_prompts(e, ids, top))
            handles = []
            if parsed.generate:  # echo with max_tokens 0 generates nothing
                handles = runner.submit_lanes(lanes)
                for _ in parsed.prompts:  # vLLM counts each prompt as a request
                    metrics.observe_request(len(parsed.params), parsed.params[0].max_tokens)
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
        answer = (
            parsed,
            handles,
            model_name if wanted is None else wanted,  # echoed, as vLLM does
            engine.tokenizer,
            metrics,
            engine.fingerprint,
            log_requests,
            report_cached_tokens,
            scores,
            reasoning_inside(lanes) if chat else None,
        )
        ctx = RequestContext(chat, *answer) if raw is None else ResponsesRequest(raw, *answer)
        if not parsed.generate:
            return ctx.prompt_only()
        if parsed.stream:
            return StreamingResponse(ctx.sse(), media_type="text/event-stream")
        return await ctx.whole(request)

    async def render(request: Request, chat: bool) -> Response:
        """vLLM's /v1/(chat/)completions/render: the prompt token ids the request would run
        on, taken in exactly as generating it would (template, tools, truncation), nothing
        generated. Cache-aware routers (vllm-router) ask it to route by a request's tokens."""
        try:
            check_key(request)
            body = await read_json(request)
            wanted, parsed = parse_for(body, chat)
            lanes = await off_loop(lanes_for, parsed, chat, "")
        except ApiError as e:
            return error_response(e)
        except ValueError as e:  # chat template errors and the like: this request's input
            return error_response(ApiError(str(e)))
        n = len(parsed.params)
        rendered = [
            {"token_ids": list(lanes[k * n].prompt_ids), "model": wanted or model_name}
            for k in range(len(parsed.prompts))
        ]
        return JSONResponse(rendered[0] if chat else rendered)

    async def chat_render(request: Request) -> Response:
        return await render(request, chat=True)

    async def completions_render(request: Request) -> Response:
        return await render(request, chat=False)

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
            check_model(wanted)
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

    async def openapi_route(request: Request) -> Response:
        return JSONResponse(openapi(__version__))

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
        g["kv_blocks_capacity"].set(report["blocks_total"])
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
            Route("/v1/completions/render", completions_render, methods=["POST"]),
            Route("/v1/chat/completions/render", chat_render, methods=["POST"]),
            Route("/v1/responses", responses_route, methods=["POST"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", model_by_id, methods=["GET"]),
            Route("/tokenize", tokenize_route, methods=["POST"]),
            Route("/detokenize", detokenize_route, methods=["POST"]),
            Route("/version", version_route, methods=["GET"]),
            Route("/openapi.json", openapi_route, methods=["GET"]),
            Route("/health", health, methods=["GET"]),
            Route("/metrics", prometheus, methods=["GET"]),
            Route("/debug/kv", debug_kv, methods=["GET"]),
            *console_routes(runner, check_key, read_json, metrics),
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
