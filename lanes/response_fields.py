"""lanes results -> the fields of OpenAI response objects: usage, and logprobs as chat and
completions report them (with an echoed prompt's, and vLLM's prompt_logprobs)."""

from __future__ import annotations

# A logprob of -inf (a token outside top-k / top-p) is not JSON; OpenAI reports such a floor.
LOGPROB_FLOOR = -9999.0


def _finite(logprob: float) -> float:
    """-inf (and NaN) as OpenAI's floor, so every logprob is a JSON number."""
    return logprob if logprob >= LOGPROB_FLOOR else LOGPROB_FLOOR


def usage(prompt_tokens: int, completions: list, cached: int) -> dict:
    generated = sum(len(c.token_ids) for c in completions)
    accepted = sum(c.num_accepted for c in completions)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": generated,
        "total_tokens": prompt_tokens + generated,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": accepted,
            "rejected_prediction_tokens": sum(c.num_drafted for c in completions) - accepted,
        },
    }


def chat_logprobs(tokenizer, token_ids: list[int], logprobs: list[float], top: list) -> dict:
    def entry(tid: int, lp: float) -> dict:
        text = tokenizer.decode([tid], skip_special_tokens=False)
        return {"token": text, "logprob": _finite(lp), "bytes": list(text.encode())}

    content = []
    for i, (tid, lp) in enumerate(zip(token_ids, logprobs, strict=True)):
        item = entry(tid, lp)
        item["top_logprobs"] = [entry(t, v) for t, v in top[i]] if i < len(top) else []
        content.append(item)
    return {"content": content}


def echo_logprobs(tokenizer, scores, with_top: bool) -> dict:
    """The prompt part of an echoed completion's logprobs: the first token has none (null)."""
    out = completion_logprobs(tokenizer, scores.token_ids, [0.0] * len(scores.token_ids), [])
    out["token_logprobs"] = [None if lp is None else _finite(lp) for lp in scores.logprobs]
    out["top_logprobs"] = [
        None
        if best is None
        else {tokenizer.decode([t], skip_special_tokens=False): _finite(v) for t, v in best}
        if with_top
        else {}
        for best in scores.top
    ]
    return out


def vllm_prompt_logprobs(tokenizer, scores) -> list:
    """vLLM's prompt_logprobs: per prompt position null, then {"token id": {logprob, rank,
    decoded_token}} for the prompt's token and the N most likely ones."""
    out: list = [None]
    for i in range(1, len(scores.token_ids)):
        t, lp = scores.token_ids[i], scores.logprobs[i]
        entry = {str(t): {"logprob": _finite(lp), "rank": scores.ranks[i]}}
        for rank, (u, v) in enumerate(scores.top[i], start=1):
            entry.setdefault(str(u), {"logprob": _finite(v), "rank": rank})
        for key, value in entry.items():
            value["decoded_token"] = tokenizer.decode([int(key)], skip_special_tokens=False)
        out.append(entry)
    return out


def completion_logprobs(
    tokenizer, token_ids: list[int], logprobs: list[float], top: list, start: int = 0
) -> dict:
    """Completions-style logprobs; text_offset counts from `start`, the characters of the
    choice's tokens before these (a stream's earlier chunks)."""
    tokens = [tokenizer.decode([t], skip_special_tokens=False) for t in token_ids]
    offsets, pos = [], start
    for t in tokens:
        offsets.append(pos)
        pos += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [_finite(lp) for lp in logprobs],
        "top_logprobs": [
            {tokenizer.decode([t], skip_special_tokens=False): _finite(v) for t, v in top[i]}
            if i < len(top)
            else {}
            for i in range(len(tokens))
        ],
        "text_offset": offsets,
    }
