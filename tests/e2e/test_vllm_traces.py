"""One trace from the caller to vLLM: through the gateway's in-process engine, vLLM's own
`llm_request` span (the engine started with `otlp_traces_endpoint`) is the child of the
gateway's try, reached by vLLM's trace headers; through vLLM's server, the server's span is the
child of the try whose traceparent it was sent."""

from __future__ import annotations

import pytest

from tests.e2e.vllm_stack import MODEL, Stack
from tests.otlp_receiver import Span

CALLER_TRACE = "5b8efff798038103d269b633813fc60c"
CALLER_SPAN = "eee19b7ec3c1b174"


def traced(stack: Stack, path: str, trace_id: str, chat: bool) -> dict[str, Span]:
    headers = {"traceparent": f"00-{trace_id}-{CALLER_SPAN}-01"}
    with stack.client(path) as client:
        if chat:
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": "Hi"}],
                max_tokens=3,
                extra_headers=headers,
            )
        else:
            client.completions.create(model=MODEL, prompt="Hi", max_tokens=3, extra_headers=headers)
    spans = stack.traces.trace(trace_id, 4)  # the gateway's three, and vLLM's
    return {s.name: s for s in spans}


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
@pytest.mark.parametrize("path", ["engine", "server"])
def test_vllm_joins_the_callers_trace_under_the_gateways_try(
    vllm_stack: Stack, path: str, chat: bool
) -> None:
    trace_id = CALLER_TRACE[:-2] + f"{(['engine', 'server'].index(path) * 2 + chat):02x}"
    spans = traced(vllm_stack, path, trace_id, chat)
    operation = "chat" if chat else "text_completion"
    server = spans[f"POST /v1/{'chat/completions' if chat else 'completions'}"]
    genai = spans[f"{operation} {MODEL}"]
    [attempt] = [s for n, s in spans.items() if n.startswith("attempt ")]
    assert server.parent_id == CALLER_SPAN
    assert genai.parent_id == server.span_id and attempt.parent_id == genai.span_id
    assert genai.attributes["gen_ai.provider.name"] == path
    assert genai.attributes["gen_ai.usage.output_tokens"] == 3
    vllm = spans["llm_request"]
    assert vllm.parent_id == attempt.span_id
    assert vllm.attributes["gen_ai.usage.completion_tokens"] == 3
