"""OpenAI-compatible request parsing and response bodies, shaped like vLLM 0.33's
(vllm/entrypoints/openai/, vllm/entrypoints/serve/engine/protocol.py).

Pure functions over JSON-like values; the HTTP plumbing is in `server.py`.

Token counts. There is no tokenizer: a prompt counts as words × 1.3 (rounded up), a chat adds 4
template tokens per message and 3 for the assistant header. A client that needs an exact size
sends `sparkops_prompt_tokens`; `sparkops_gen_tokens` makes the answer stop (EOS) after that many
tokens instead of running to `max_tokens`.
"""

from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .styles import Style

WORDS_TO_TOKENS = 1.3
CHAT_TOKENS_PER_MESSAGE = 4
CHAT_ASSISTANT_HEADER = 3
COMPLETION_DEFAULT_MAX_TOKENS = 16  # the OpenAI completions default
CHAT_NATURAL_LENGTH = 64  # where a chat answer "ends" when the client set no limit

_FILLER = (
    "the", "node", "keeps", "its", "memory", "ledger", "honest", "so", "every", "engine", "knows",
    "how", "much", "room", "is", "left", "before", "a", "restart", "while", "prefill", "needs",
    "space", "for", "transient", "buffers", "and", "decode", "reads", "weights",
)  # fmt: skip


class ApiError(Exception):
    """A request vLLM would refuse: HTTP status, message, OpenAI error type and parameter."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True)
class Generation:
    """A validated completion or chat request, sized in tokens."""

    chat: bool
    model: str
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    stream: bool
    include_usage: bool


def estimate_tokens(text: str) -> int:
    """Words × 1.3, rounded up, at least 1."""
    return max(1, math.ceil(len(text.split()) * WORDS_TO_TOKENS))


def _message_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: [{"type": "text", "text": "…"}, …]
        return " ".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    override = body.get("sparkops_prompt_tokens")
    if override is not None:
        if not isinstance(override, int) or isinstance(override, bool) or override < 1:
            raise ApiError(
                400,
                "sparkops_prompt_tokens must be a positive integer",
                "BadRequestError",
                "sparkops_prompt_tokens",
            )
        return override
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "messages must be a non-empty list", "BadRequestError", "messages")
        words = sum(
            estimate_tokens(_message_text(m.get("content")))
            for m in messages
            if isinstance(m, dict)
        )
        return words + CHAT_TOKENS_PER_MESSAGE * len(messages) + CHAT_ASSISTANT_HEADER
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return estimate_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):
            return len(prompt)  # already token ids
        return sum(estimate_tokens(p) if isinstance(p, str) else len(p) for p in prompt)
    raise ApiError(400, "prompt must be a string or a list", "BadRequestError", "prompt")


def _positive_int(body: dict[str, Any], key: str) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ApiError(400, f"{key} must be at least 1, got {value}.", "BadRequestError", key)
    return value


def parse_generation(
    body: Any, *, chat: bool, served_names: tuple[str, ...], max_model_len: int
) -> Generation:
    """Validate a `/v1/completions` or `/v1/chat/completions` body; raise ApiError if refused."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", "BadRequestError")
    model = body.get("model") or served_names[0]
    if model not in served_names:
        raise ApiError(404, f"The model `{model}` does not exist.", "NotFoundError", "model")
    prompt_tokens = _prompt_tokens(body, chat)
    max_tokens = _positive_int(body, "max_tokens")
    if chat and max_tokens is None:
        max_tokens = _positive_int(body, "max_completion_tokens")
    natural = _positive_int(body, "sparkops_gen_tokens")
    if max_tokens is None:
        if chat:  # vLLM's default: whatever room the context leaves
            max_tokens = max(max_model_len - prompt_tokens, 1)
            natural = natural or CHAT_NATURAL_LENGTH
        else:
            max_tokens = COMPLETION_DEFAULT_MAX_TOKENS
    if prompt_tokens + max_tokens > max_model_len:
        raise ApiError(
            400,
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the messages, "
            f"{max_tokens} in the completion). Please reduce the length of the messages or "
            "completion.",
            "BadRequestError",
        )
    options = body.get("stream_options")
    return Generation(
        chat=chat,
        model=model,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        output_tokens=min(natural or max_tokens, max_tokens),
        stream=bool(body.get("stream")),
        include_usage=isinstance(options, dict) and bool(options.get("include_usage")),
    )


def new_request_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def filler_text(start: int, count: int) -> str:
    """`count` words standing for tokens `start…start+count` of an answer."""
    words = [_FILLER[(start + i) % len(_FILLER)] for i in range(count)]
    return ("" if start == 0 else " ") + " ".join(words) if words else ""


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def response_body(
    gen: Generation, request_id: str, created: int, generated: int, finish_reason: str
) -> dict[str, Any]:
    """The non-streaming answer, with `usage`."""
    text = filler_text(0, generated)
    if gen.chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text, "tool_calls": []},
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
        }
        kind = "chat.completion"
    else:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": None,
            "finish_reason": finish_reason,
            "stop_reason": None,
            "prompt_logprobs": None,
        }
        kind = "text_completion"
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": gen.model,
        "choices": [choice],
        "usage": usage(gen.prompt_tokens, generated),
    }


def stream_chunk(
    gen: Generation,
    request_id: str,
    created: int,
    start: int,
    count: int,
    finish_reason: str | None,
) -> dict[str, Any]:
    """One server-sent event's payload carrying tokens `start…start+count`."""
    text = filler_text(start, count)
    if gen.chat:
        delta: dict[str, Any] = {"content": text}
        if start == 0:
            delta["role"] = "assistant"
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None}
        kind = "text_completion"
    choice["finish_reason"] = finish_reason
    return {
        "id": request_id,
        "object": kind,
        "created": created,
        "model": gen.model,
        "choices": [choice],
    }


def error_body(style: Style, error: ApiError) -> dict[str, Any]:
    """vLLM's error JSON: nested under `error` in 2026, flat with `object: error` in 2025."""
    fields = {
        "message": error.message,
        "type": error.err_type,
        "param": error.param,
        "code": error.status,
    }
    if style.modern:
        return {"error": fields}
    return {"object": "error", **fields}


def models_body(served_names: tuple[str, ...], root: str, max_model_len: int) -> dict[str, Any]:
    """`GET /v1/models` (vLLM's `ModelCard`): one card per served name, `max_model_len`
    included."""
    created = int(time.time())
    cards = []
    for name in served_names:
        cards.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": "vllm",
                "root": root,
                "parent": None,
                "max_model_len": max_model_len,
                "permission": [
                    {
                        "id": f"modelperm-{uuid.uuid4().hex}",
                        "object": "model_permission",
                        "created": created,
                        "allow_create_engine": False,
                        "allow_sampling": True,
                        "allow_logprobs": True,
                        "allow_search_indices": False,
                        "allow_view": True,
                        "allow_fine_tuning": False,
                        "organization": "*",
                        "group": None,
                        "is_blocking": False,
                    }
                ],
            }
        )
    return {"object": "list", "data": cards}
