"""The request bodies lanes takes, as pydantic models: the one list of field names and types that
`/openapi.json` publishes and that tells which fields of a request lanes does not know (logged
once each, as vLLM warns). Values are checked by lanes/openai_api.py, whose errors name the
field and the bound it breaks (a 400 in OpenAI's shape); these models do not reject anything.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Json = dict[str, Any]


class _Sampling(BaseModel):
    """Fields both OpenAI endpoints take, and vLLM's and lanes' additions."""

    model_config = ConfigDict(extra="allow")

    model: str | None = Field(None, description="a served model name")
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    n: int | None = Field(None, ge=1, le=16)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool | None = None
    stream_options: Json | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    min_p: float | None = Field(None, ge=0, le=1)
    min_tokens: int | None = Field(None, ge=0)
    logit_bias: dict[str, float] | None = None
    response_format: Json | None = None
    structured_outputs: Json | None = None
    guided_json: Json | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    truncate_prompt_tokens: int | None = None
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    ignore_eos: bool | None = Field(None, description="lanes: generate past end-of-sequence")
    draft: bool | None = Field(None, description="lanes: false turns speculative decoding off")
    cache_salt: str | None = Field(None, description="prompt-cache entries shared per salt")
    return_token_ids: bool | None = Field(None, description="vLLM's: each choice's token ids")
    return_draft_spans: bool | None = Field(
        None, description="lanes: the text in runs of accepted drafts and target tokens"
    )
    user: str | None = None
    metadata: Json | None = None
    store: bool | None = None
    service_tier: str | None = None
    request_id: str | None = None
    # refused with a 400 when set (they would change the output): listed so none is "unknown"
    best_of: int | None = None
    suffix: str | None = None
    functions: list[Json] | None = None
    function_call: str | Json | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool | None = None


class ChatCompletionRequest(_Sampling):
    messages: list[Json]
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=20)
    tools: list[Json] | None = None
    tool_choice: Literal["auto", "required", "none"] | Json | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: Json | None = None
    documents: list[dict[str, str]] | None = None


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[Json]
    instructions: str | None = None
    max_output_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    tools: list[Json] | None = None
    tool_choice: Literal["auto", "required", "none"] | Json | None = None
    parallel_tool_calls: bool | None = None
    text: Json | None = None
    stream: bool | None = None
    previous_response_id: str | None = Field(None, description="refused: lanes is stateless")
    store: bool | None = None
    metadata: Json | None = None
    user: str | None = None
    truncation: str | None = None
    include: list[str] | None = None
    reasoning: Json | None = None
    seed: int | None = None
    draft: bool | None = None


MODELS: dict[str, type[BaseModel]] = {
    "/v1/completions": CompletionRequest,
    "/v1/chat/completions": ChatCompletionRequest,
    "/v1/responses": ResponsesRequest,
}


def unknown_fields(body: dict, model: type[BaseModel]) -> list[str]:
    """The request's field names the model does not declare."""
    return sorted(name for name in body if name not in model.model_fields)


def openapi(version: str) -> dict:
    """An OpenAPI 3.1 document of the generation endpoints' request bodies."""
    schemas: dict[str, Any] = {}
    paths = {}
    for path, model in MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema
        ref = {"$ref": f"#/components/schemas/{model.__name__}"}
        paths[path] = {
            "post": {
                "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
                "responses": {"200": {"description": "the response object, or an SSE stream"},
                              "400": {"description": "an OpenAI-style error naming the field"}},
            }
        }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "lanes", "version": version},
        "paths": paths,
        "components": {"schemas": schemas},
    }
