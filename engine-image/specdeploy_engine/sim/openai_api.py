"""The OpenAI-compatible surface: what a completion request asks for, and the JSON the engines answer.

    asked = read_request(body, chat=True, served_name="llama", max_model_len=8192, rng=random.Random(1))
    chunk = completion_chunk(asked, text=" the", finish_reason=None)
    answer = completion_response(asked, text, tokens, "length",
                                 metrics=per_request_metrics(asked, request.spec_stats, streamed=False))

The simulator has no tokenizer: a prompt costs one token per whitespace-separated word (a list of token
ids costs its length), and a chat adds CHAT_TOKENS_PER_MESSAGE per message for the template. Generated
text is one word per token from a fixed vocabulary, so `usage` and the text agree. With vLLM's
--per-request-spec-decode-metrics the answer carries the request's own speculation under
`metrics.speculative_decoding` (per_request_metrics).

Exceptions:

    ValueError
     └── ApiError   a request the engine would refuse; `status` and `body` are its HTTP answer
"""

from __future__ import annotations

import math
import random
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from specdeploy_engine.sim.engine import RequestSpecDecodeStats

CHAT_TOKENS_PER_MESSAGE = 4     # Llama-3's <|start_header_id|>role<|end_header_id|> … <|eot_id|>
COMPLETION_DEFAULT_MAX_TOKENS = 16   # the OpenAI completions API default, as vLLM applies it
# A chat without max_tokens stops by itself: its length is drawn from a lognormal with this mean, as an
# assistant turn of a chat benchmark (ShareGPT answers average about 200 tokens).
NATURAL_LENGTH_MEAN = 256
NATURAL_LENGTH_SIGMA = 0.6
DEFAULT_TEMPERATURE = 1.0       # the OpenAI and vLLM default when a request does not set one
VOCABULARY = ("the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "was", "on",
              "be", "at", "by", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they", "which",
              "one", "you", "were", "all", "we", "her", "she", "there", "would", "their", "will", "when")


class ApiError(ValueError):
    """An OpenAI-style error answer (vLLM's ErrorResponse shape)."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError", param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.body = {"error": {"message": message, "type": kind, "param": param, "code": status}}


@dataclass(frozen=True)
class Asked:
    """A parsed completion or chat request."""

    chat: bool
    model: str
    prompt_tokens: int
    output_tokens: int
    finish_reason: str          # length when max_tokens ends it, stop when it ends by itself
    temperature: float
    stream: bool
    include_usage: bool
    id: str
    created: int
    text: str = ""              # the prompt's text (chat: the messages' contents), for workloadAcceptance
    single_prompt: bool = True  # false for a completions batch of several prompts


def _text(value: Any) -> str:
    """The text of a prompt or message content: strings and text parts, one per line; token ids have none."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(part for part in (_text(item) for item in value) if part)
    if isinstance(value, dict):
        return _text(value.get("text", ""))
    return ""


def _words(text: Any) -> int:
    if isinstance(text, str):
        return len(text.split())
    if isinstance(text, list):
        if all(isinstance(item, int) for item in text):
            return len(text)                       # token ids
        return sum(_words(item) for item in text)  # a batch of prompts, or content parts
    if isinstance(text, dict):
        return _words(text.get("text", ""))
    return 0


def _number(body: dict[str, Any], name: str, default: float | None) -> float | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"`{name}` must be a number, got {value!r}", param=name)
    return float(value)


def read_request(body: Any, *, chat: bool, served_name: str, max_model_len: int, rng: random.Random) -> Asked:
    """Validate a /v1/completions or /v1/chat/completions body as vLLM would."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model") or served_name
    if model != served_name:
        raise ApiError(404, f"The model `{model}` does not exist.", kind="NotFoundError", param="model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ApiError(400, "`messages` must be a non-empty list", param="messages")
        prompt = sum(_words(message.get("content", "")) + CHAT_TOKENS_PER_MESSAGE
                     for message in messages if isinstance(message, dict))
        text = _text([message.get("content", "") for message in messages if isinstance(message, dict)])
        single = True
    else:
        if "prompt" not in body:
            raise ApiError(400, "`prompt` is required", param="prompt")
        prompt = _words(body["prompt"])
        text = _text(body["prompt"])
        batch = body["prompt"]
        single = not (isinstance(batch, list) and len(batch) > 1
                      and not all(isinstance(item, int) for item in batch))
    prompt = max(1, prompt)
    if (body.get("n") or 1) != 1:
        raise ApiError(400, "the simulator serves n=1 only", param="n")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is None and not chat:
        limit = COMPLETION_DEFAULT_MAX_TOKENS
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ApiError(400, f"`max_tokens` must be a positive integer, got {limit!r}", param="max_tokens")
        if prompt + limit > max_model_len:
            raise ApiError(400, (
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt + limit} tokens ({prompt} in the messages, {limit} in the completion). Please reduce "
                "the length of the messages or completion."), param="max_tokens")
        output, finish = limit, "length"
    else:
        natural = rng.lognormvariate(math.log(NATURAL_LENGTH_MEAN) - NATURAL_LENGTH_SIGMA**2 / 2,
                                     NATURAL_LENGTH_SIGMA)
        output, finish = max(1, min(max_model_len - prompt, int(natural))), "stop"
        if output < 1:
            raise ApiError(400, f"the prompt ({prompt} tokens) fills the context of {max_model_len} tokens")
    temperature = _number(body, "temperature", DEFAULT_TEMPERATURE)
    assert temperature is not None
    if not 0.0 <= temperature <= 2.0:
        raise ApiError(400, f"`temperature` must be between 0 and 2, got {temperature!r}", param="temperature")
    options = body.get("stream_options") or {}
    prefix = "chatcmpl" if chat else "cmpl"
    return Asked(
        chat=chat, model=served_name, prompt_tokens=prompt, output_tokens=output, finish_reason=finish,
        temperature=temperature, stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        id=f"{prefix}-{uuid.UUID(int=rng.getrandbits(128)).hex}", created=int(time.time()),
        text=text, single_prompt=single,
    )


def generated_text(rng: random.Random, count: int) -> str:
    """`count` words, each with its leading space (one word per token)."""
    return "".join(" " + VOCABULARY[rng.randrange(len(VOCABULARY))] for _ in range(count))


def usage(asked: Asked, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": asked.prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": asked.prompt_tokens + completion_tokens}


def completion_chunk(asked: Asked, text: str, finish_reason: str | None, *, first: bool = False) -> dict[str, Any]:
    """One streamed chunk (chat.completion.chunk or text_completion)."""
    if asked.chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if first else {"content": text}
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    return {"id": asked.id, "object": kind, "created": asked.created, "model": asked.model, "choices": [choice]}


# vLLM 0.32's per-request speculative metrics (--per-request-spec-decode-metrics summary|detailed). Facts
# from its source, followed here:
# - vllm/v1/metrics/stats.py, RequestSpecDecodeMetrics: per request, a dense histogram indexed by the
#   drafted tokens accepted in a verify step (length num_speculative_tokens + 1, the bonus token not
#   counted) and the drafted tokens; `detailed` also keeps the per-step accepted and drafted counts in
#   order. Its to_dict gives mean_acceptance_length = 1 + accepted / steps (1.0 without steps),
#   draft_acceptance_rate = accepted / drafted (0.0 without drafts), acceptance_histogram, num_spec_steps,
#   num_accepted_draft_tokens, num_draft_tokens, num_spec_tokens, and per_step_accepted /
#   per_step_drafted only when recorded. vllm/v1/core/sched/scheduler.py creates it for every request when
#   the level is not "none" and observes it at each verify step with scheduled drafts.
# - vllm/entrypoints/generate/base/protocol.py: SpeculativeDecodingMetrics (those keys; the per-step arrays
#   null unless detailed) is the `speculative_decoding` field of PerRequestMetrics, which also has
#   time_to_first_token_ms, generation_time_ms, queue_time_ms, mean_itl_ms and tokens_per_second (filled
#   only with --enable-per-request-metrics, which the simulator does not time: left null).
# - vllm/entrypoints/openai/completion/serving.py and chat_completion/serving.py: the response's top-level
#   `metrics` is that PerRequestMetrics, only for one prompt with n == 1 (suppressed otherwise). A
#   non-streamed answer is model_dump()ed, so null fields appear; streamed, `metrics` rides on the final
#   usage chunk only (stream_options.include_usage), dumped with exclude_none (null fields left out).
# - vllm/config/vllm.py: the flag other than "none" without --speculative-config refuses to start
#   (sim/argv.py).
PER_REQUEST_TIMING_FIELDS = ("time_to_first_token_ms", "generation_time_ms", "queue_time_ms", "mean_itl_ms",
                             "tokens_per_second")


def speculative_decoding(stats: RequestSpecDecodeStats, *, streamed: bool) -> dict[str, Any]:
    """metrics.speculative_decoding of one request, in vLLM's keys and meaning."""
    steps, accepted = stats.num_spec_steps, stats.num_accepted_tokens
    document: dict[str, Any] = {
        "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
        "draft_acceptance_rate": accepted / stats.num_draft_tokens if stats.num_draft_tokens else 0.0,
        "acceptance_histogram": list(stats.histogram),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": stats.num_draft_tokens,
        "num_spec_tokens": stats.num_spec_tokens,
    }
    if stats.per_step_accepted:
        document["per_step_accepted"] = list(stats.per_step_accepted)
        document["per_step_drafted"] = list(stats.per_step_drafted)
    elif not streamed:
        document["per_step_accepted"] = document["per_step_drafted"] = None
    return document


def per_request_metrics(asked: Asked, stats: RequestSpecDecodeStats | None, *,
                        streamed: bool) -> dict[str, Any] | None:
    """The response's `metrics` (vLLM's PerRequestMetrics), or None when vLLM sends none: no per-request
    speculative metrics asked for, or a batch of several prompts."""
    if stats is None or not asked.single_prompt:
        return None
    timing: dict[str, Any] = {} if streamed else dict.fromkeys(PER_REQUEST_TIMING_FIELDS)
    return {**timing, "speculative_decoding": speculative_decoding(stats, streamed=streamed)}


def usage_chunk(asked: Asked, completion_tokens: int, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    kind = "chat.completion.chunk" if asked.chat else "text_completion"
    chunk = {"id": asked.id, "object": kind, "created": asked.created, "model": asked.model, "choices": [],
             "usage": usage(asked, completion_tokens)}
    if metrics is not None:
        chunk["metrics"] = metrics
    return chunk


def completion_response(asked: Asked, text: str, completion_tokens: int, finish_reason: str,
                        metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """The whole answer of a non-streamed request."""
    if asked.chat:
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish_reason}
        kind = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        kind = "text_completion"
    response = {"id": asked.id, "object": kind, "created": asked.created, "model": asked.model,
                "choices": [choice], "usage": usage(asked, completion_tokens)}
    if metrics is not None:
        response["metrics"] = metrics
    return response


def models_response(served_name: str, root: str, max_model_len: int, owned_by: str) -> dict[str, Any]:
    return {"object": "list", "data": [{
        "id": served_name, "object": "model", "created": int(time.time()), "owned_by": owned_by, "root": root,
        "parent": None, "max_model_len": max_model_len,
    }]}
