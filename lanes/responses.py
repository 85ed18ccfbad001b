"""One HTTP request's answer: its choices streamed as SSE chunks or gathered into one OpenAI
response object, its usage, tool calls, logprobs, its metrics and its log line; and the
OpenAI-style error response."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from lanes import __version__
from lanes.async_engine import Aborted, Delta, Failed, Finished, RequestHandle, ShuttingDown
from lanes.openai_api import ApiError, ParsedRequest
from lanes.prompt_scores import PromptScores
from lanes.reasoning import ReasoningStream, split_reasoning
from lanes.response_fields import (
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    usage,
    vllm_prompt_logprobs,
)
from lanes.server_metrics import finish_reason
from lanes.token_fields import TokenFields

log = logging.getLogger("lanes")


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class RequestContext:
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
        scores: list[PromptScores] | None = None,
        reasoning_inside: bool | None = None,
    ):
        """scores: each prompt's logprobs, for echo and prompt_logprobs (lanes/prompt_scores.py).
        reasoning_inside: None, no reasoning parsing; else whether the prompt opened the
        reasoning block (lanes/reasoning.py)."""
        self.chat, self.parsed, self.handles = chat, parsed, handles
        self.scores = scores
        self.reasoning_inside = reasoning_inside
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
        self.fields = TokenFields(parsed.return_token_ids, parsed.return_draft_spans)
        self._pending: dict[int, dict] = {}  # choice -> fields for its next chunk
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

    def _prompt_of(self, i: int) -> tuple[str, PromptScores]:
        """Choice i's prompt: its text as sent (decoded where it came as token ids), scores."""
        k = i // len(self.parsed.params)
        prompt, scores = self.parsed.prompts[k], self.scores[k]
        as_sent = isinstance(prompt, str) and self.parsed.params[0].truncate_prompt_tokens is None
        text = prompt if as_sent else self.tokenizer.decode(scores.token_ids)
        return text, scores

    def _echo(self, i: int) -> tuple[str, dict | None]:
        """An echoed choice's prompt part: its text and logprobs; the choice's own text and
        logprobs go on after them (text offsets too)."""
        text, scores = self._prompt_of(i)
        if self.parsed.logprobs is None:
            return text, None
        lp = echo_logprobs(self.tokenizer, scores, with_top=bool(self.parsed.logprobs))
        self._text_offsets[i] = sum(len(t) for t in lp["tokens"])
        return text, lp

    def _extras(self, i: int) -> dict:
        """vLLM's prompt_logprobs of choice i's prompt, where asked."""
        if self.parsed.prompt_logprobs is None:
            return {}
        return {"prompt_logprobs": vllm_prompt_logprobs(self.tokenizer, self._prompt_of(i)[1])}

    def _logprobs(self, i: int, token_ids, logprobs, top, streamed: bool = False) -> dict | None:
        if self.parsed.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(self.tokenizer, token_ids, logprobs, top)
        start = self._text_offsets.get(i, 0) if streamed or self.parsed.echo else 0
        out = completion_logprobs(self.tokenizer, token_ids, logprobs, top, start)
        if streamed:  # the next chunk's offsets go on from here
            self._text_offsets[i] = start + sum(len(t) for t in out["tokens"])
        return out

    def _prompt_ids(self, i: int) -> dict:
        """vLLM's prompt_token_ids of a completions choice, where asked."""
        if not self.parsed.return_token_ids:
            return {}
        return {"prompt_token_ids": list(self.handles[i].prompt_ids)}

    @staticmethod
    def _failure(event: Failed) -> ApiError:
        if isinstance(event.error, ShuttingDown):
            return ApiError(str(event.error), status=503, kind="server_error")
        return ApiError(
            f"{event.error}; the server log has the details", status=500, kind="server_error"
        )

    async def gather(self, request: Request) -> dict[int, object] | Response:
        """Every choice's Completion by index, or the error response that ends the request (a
        client that disconnects cancels its choices meanwhile)."""
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
        return completions

    def _body(self, choices: list, usage_: dict) -> dict:
        return {
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": choices,
            "usage": usage_,
        }

    async def whole(self, request: Request) -> Response:
        completions = await self.gather(request)
        if isinstance(completions, Response):
            return completions
        choices = []
        for i in sorted(completions):
            c = completions[i]
            prompt_text, prompt_lp = self._echo(i) if self.parsed.echo else ("", None)
            lp = self._logprobs(i, c.token_ids, c.logprobs, c.top_logprobs)
            if prompt_lp is not None:
                lp = {key: prompt_lp[key] + lp[key] for key in lp}
            if self.chat:
                message, reason = self._message(c)
                choices.append(
                    {"index": i, "message": message, "logprobs": lp, "finish_reason": reason,
                     **self.fields.of_completion(c)}
                )  # fmt: skip
            else:
                text, reason = prompt_text + c.text, finish_reason(c)
                choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": reason,
                                **self._extras(i), **self._prompt_ids(i),
                                **self.fields.of_completion(c)})  # fmt: skip
        body = self._body(choices, self._finish(completions))
        if self.chat and self.parsed.return_token_ids:  # vLLM: the response's, for chat
            body["prompt_token_ids"] = list(self.handles[0].prompt_ids)
        if self.chat and self.parsed.prompt_logprobs is not None:  # vLLM: the response's
            body["prompt_logprobs"] = self._extras(0)["prompt_logprobs"]
        return JSONResponse(body)

    def prompt_only(self) -> Response:
        """echo with max_tokens 0: each choice is its prompt, no tokens generated."""
        choices = []
        for i in range(len(self.parsed.prompts) * len(self.parsed.params)):
            text, lp = self._echo(i)
            choices.append({"index": i, "text": text, "logprobs": lp, "finish_reason": "length",
                            **self._extras(i)})  # fmt: skip
        prompt_tokens = sum(len(s.token_ids) for s in self.scores)
        usage_ = usage(prompt_tokens, [], 0) | {"prompt_tokens_details": None}
        return JSONResponse(self._body(choices, usage_))

    def _message(self, c) -> tuple[dict, str]:
        """A chat choice's message and finish_reason: with tools, the <tool_call> blocks of its
        text become tool_calls (finish_reason "tool_calls")."""
        reason = finish_reason(c)
        reasoning, text = None, c.text
        if self.reasoning_inside is not None:  # <think> ... </think> apart from the answer
            reasoning, text = split_reasoning(c.text, self.reasoning_inside)
        tools = self.parsed.tools
        content, calls = tools.parse(text) if tools is not None else (text, [])
        message: dict = {"role": "assistant", "content": text if not calls else content}
        if reasoning is not None:
            message["reasoning_content"] = reasoning
        if not calls:
            return message, reason
        return message | {"tool_calls": calls}, "tool_calls" if reason == "stop" else reason

    def _chat_deltas(
        self, i: int, reasoning: str, content: str, lp, streams: dict, parsed: bool
    ) -> list[str]:
        """The chunks of one streamed piece of a chat choice: its reasoning, then its content
        (through the tool-call stream where there are tools). `parsed`: reasoning is being
        parsed, so an empty piece makes no chunk."""
        out = []
        if reasoning:
            delta = {"index": i, "delta": {"reasoning_content": reasoning}, "finish_reason": None}
            out.append(self._chunk([delta | {"logprobs": None if content else lp}]))
        if streams:
            text, calls = streams[i].feed(content)
            if text or calls:
                out.append(self._tool_delta(i, text, calls))
        elif content or not parsed:
            delta = {"index": i, "delta": {"content": content}, "finish_reason": None}
            out.append(self._chunk([delta | {"logprobs": lp}]))
        return out

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

    def _chunk(self, choices: list, usage_: dict | None = None, top: dict | None = None) -> str:
        """An SSE chunk of these choices (each with the fields pending for it), `top` fields
        beside them."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        body = {
            "id": self.id,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint,
            "choices": [c | self._pending.pop(c["index"], {}) for c in choices],
        }
        if usage_ is not None:
            body["usage"] = usage_
        if top:
            body |= top
        return f"data: {json.dumps(body)}\n\n"

    def _last_chunk(self, i: int, reason: str) -> str:
        """The chunk that ends choice i: no new text, its finish_reason."""
        empty = {"delta": {}} if self.chat else {"text": ""}
        return self._chunk([{"index": i, **empty, "logprobs": None, "finish_reason": reason}])

    async def sse(self) -> AsyncIterator[str]:
        completions: dict[int, object] = {}
        if self.parsed.return_token_ids and not self.chat:  # vLLM: in each choice's first chunk
            for i in range(len(self.handles)):
                self._pending[i] = self._prompt_ids(i)
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
                ],
                top={"prompt_token_ids": list(self.handles[0].prompt_ids)}
                if self.parsed.return_token_ids
                else None,
            )
        elif self.parsed.echo or self.parsed.prompt_logprobs is not None:
            for i in range(len(self.handles)):  # the prompt first, as vLLM streams it
                text, lp = self._echo(i) if self.parsed.echo else ("", None)
                first = {"index": i, "text": text, "logprobs": lp, "finish_reason": None}
                yield self._chunk([{**first, **self._extras(i)}])
        tools = self.parsed.tools  # with tools: the <tool_call> blocks become tool_calls
        streams = {i: tools.stream() for i in range(len(self.handles))} if tools else {}
        thinking = {}  # reasoning apart from the answer, per choice
        if self.chat and self.reasoning_inside is not None:
            thinking = {i: ReasoningStream(self.reasoning_inside) for i in range(len(self.handles))}
        async for i, event in self._events():
            if isinstance(event, Delta):
                if self.fields.asked:
                    self._pending[i] = self._pending.get(i, {}) | self.fields.of_delta(i, event)
                lp = None
                if not streams:
                    lp = self._logprobs(
                        i, event.token_ids, event.logprobs, event.top_logprobs, streamed=True
                    )
                if not self.chat:
                    yield self._chunk(
                        [{"index": i, "text": event.text, "logprobs": lp, "finish_reason": None}]
                    )
                    continue
                reasoning, content = thinking[i].feed(event.text) if thinking else ("", event.text)
                for chunk in self._chat_deltas(i, reasoning, content, lp, streams, bool(thinking)):
                    yield chunk
                if i in self._pending:  # the piece made no chunk of its own: its fields alone
                    yield self._chunk([{"index": i, "delta": {}, "logprobs": None,
                                        "finish_reason": None}])  # fmt: skip
            elif isinstance(event, Finished):
                completions[i] = event.completion
                reason = finish_reason(event.completion)
                if thinking:
                    for chunk in self._chat_deltas(i, *thinking[i].flush(), None, streams, True):
                        yield chunk
                if streams:
                    rest, calls = streams[i].finish()
                    if rest or calls:
                        yield self._tool_delta(i, rest, calls)
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
