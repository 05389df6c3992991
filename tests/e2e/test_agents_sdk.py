"""The OpenAI Agents SDK as a client of `POST /v1/responses`: an `Agent` with a function tool,
on `OpenAIResponsesModel` (the SDK's default API) over an `AsyncOpenAI` pointed at the gateway,
run to its final output with `Runner.run`, `Runner.run_sync` and `Runner.run_streamed`.

* On the session gateway's chat-only scripted upstreams (Fireworks' dialect and an
  openai-compatible server): the gateway serves the Responses API by translating to chat and
  back. The fake model (tests/upstreams/chat_fake.py) calls the tool when the last user message
  holds `__tool__`, with arguments made from the tool's schema as the SDK sends it; the SDK runs
  the tool and sends its output back; the fake model then answers in text, stopped after
  EOS_AFTER tokens by the `__eos_<k>__` marker (an answer cut at its bound would be an
  incomplete response, which the SDK raises on). Every value is computed from the fake model.
* On the real vLLM stack (tests/e2e/vllm_stack.py), through the in-process engine (served as
  chat) and vLLM's own server behind the gateway (which serves the Responses API itself): the
  tiny model is random, so the call is forced (`tool_choice="required"`) and the run stops on
  the tool's output (`tool_use_behavior="stop_on_first_tool"`). The stack is the session's: this
  module starts no engine of its own.

Tracing is disabled: nothing here may call OpenAI's servers.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import jsonschema
import openai
import pytest
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    OpenAIResponsesModel,
    RawResponsesStreamEvent,
    RunConfig,
    RunItemStreamEvent,
    Runner,
    RunResult,
    ToolCallItem,
    ToolCallOutputItem,
    function_tool,
    set_tracing_disabled,
)
from agents.result import RunResultBase
from openai.types.responses import (
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionToolCall,
    ResponseTextDeltaEvent,
)

from tests.e2e.chat_vllm import NO_WHITESPACE, TOOL_TOKENS
from tests.e2e.conftest import Env
from tests.e2e.support import FW, GENERIC
from tests.e2e.vllm_stack import MODEL, PATHS, Stack
from tests.upstreams.chat_fake import chat_prompt, fake_arguments, pieces
from tests.upstreams.fakegen import expected_text
from tests.vllm_proc import require_vllm

# The SDK exports traces to OpenAI unless told not to: off for the process (the SDK's global)
# and again in each run's config.
set_tracing_disabled(True)
RUN = RunConfig(tracing_disabled=True)

Json = dict[str, Any]
CHAT_ONLY = (FW, GENERIC)  # aliases whose upstreams speak chat completions only
INSTRUCTIONS = "You answer questions about the weather."
EOS_AFTER = 6
ASK = f"What is the weather in Paris? __tool__ __eos_{EOS_AFTER}__"


def report(city: str, days: int) -> str:
    """What the weather tool answers: its arguments in it, so the final text depends on them."""
    return f"Sunny in {city} for {days} days, 21 C"


@dataclass
class Weather:
    """A function tool (`@function_tool`) that records the arguments of each call."""

    calls: list[Json] = field(default_factory=list)

    def tool(self) -> FunctionTool:
        @function_tool
        def get_weather(city: str, days: int) -> str:
            """The weather in a city.

            Args:
                city: The city.
                days: How many days ahead.
            """
            self.calls.append({"city": city, "days": days})
            return report(city, days)

        return get_weather


# What the fake model makes of the tool's schema as the SDK sends it, and the text it answers
# once the tool's output is in the conversation (the prompt: the chat messages' texts).
SCHEMA = Weather().tool().params_json_schema
ARGUMENTS = fake_arguments(SCHEMA)
ARGS: Json = json.loads(ARGUMENTS)
OUTPUT = report(**ARGS)
PROMPT = chat_prompt([{"content": text} for text in (INSTRUCTIONS, ASK, OUTPUT)])
FINAL = expected_text(PROMPT, 0, EOS_AFTER)


def weather_agent(client: openai.AsyncOpenAI, alias: str, tool: FunctionTool) -> Agent[Any]:
    return Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        model=OpenAIResponsesModel(model=alias, openai_client=client),
        tools=[tool],
    )


def call_id_of(result: RunResultBase) -> str:
    """The id of the run's one function call (its output answers the same id)."""
    (call,) = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    (output,) = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    raw = call.raw_item
    assert isinstance(raw, ResponseFunctionToolCall), raw
    assert raw.name == "get_weather" and raw.arguments == ARGUMENTS
    answered: Any = output.raw_item  # a function_call_output item, as the SDK sends it back
    assert output.output == OUTPUT and answered["call_id"] == raw.call_id
    return raw.call_id


def check_run(env: Env, alias: str, weather: Weather, result: RunResultBase) -> None:
    """The tool ran once with the fake model's arguments, the final output is the fake model's
    text for the whole conversation, and the upstream got the SDK's tool and, on the second
    turn, the call and its output under the call's id."""
    assert weather.calls == [ARGS]
    assert result.final_output == FINAL
    call_id = call_id_of(result)
    first, second = (r["body"] for r in env.upstream(alias).requests())
    # The SDK's strict function tool, as chat has it (strict schemas are what the SDK makes).
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city.",
                "parameters": SCHEMA,
                "strict": True,
            },
        }
    ]
    assert first["messages"] == second["messages"][:2]
    assert second["messages"][:2] == [
        {"role": "system", "content": INSTRUCTIONS},
        {"role": "user", "content": ASK},
    ]
    assistant, answer = second["messages"][2:]
    assert assistant["role"] == "assistant"
    (call,) = assistant["tool_calls"]
    assert call["id"] == call_id
    assert call["function"] == {"name": "get_weather", "arguments": ARGUMENTS}
    assert answer == {"role": "tool", "tool_call_id": call_id, "content": OUTPUT}
    assert chat_prompt(second["messages"]) == PROMPT
    usage = result.context_wrapper.usage
    assert usage.requests == 2
    assert usage.output_tokens == len(pieces(ARGUMENTS)) + EOS_AFTER


# ---------------------------------------------------------------- chat-only scripted upstreams


@pytest.mark.parametrize("alias", CHAT_ONLY)
async def test_an_agent_calls_its_tool_and_answers(env: Env, alias: str) -> None:
    weather = Weather()
    async with env.async_client() as client:
        result = await Runner.run(weather_agent(client, alias, weather.tool()), ASK, run_config=RUN)
    check_run(env, alias, weather, result)


@pytest.mark.parametrize("alias", CHAT_ONLY)
async def test_a_streamed_run(env: Env, alias: str) -> None:
    weather = Weather()
    async with env.async_client() as client:
        agent = weather_agent(client, alias, weather.tool())
        result = Runner.run_streamed(agent, ASK, run_config=RUN)
        events = [event async for event in result.stream_events()]
    check_run(env, alias, weather, result)
    raw = [e.data for e in events if isinstance(e, RawResponsesStreamEvent)]
    deltas = [d.delta for d in raw if isinstance(d, ResponseTextDeltaEvent)]
    assert "".join(deltas) == FINAL and len(deltas) == EOS_AFTER
    args = [d.delta for d in raw if isinstance(d, ResponseFunctionCallArgumentsDeltaEvent)]
    assert "".join(args) == ARGUMENTS
    named = [e.name for e in events if isinstance(e, RunItemStreamEvent)]
    assert named == ["tool_called", "tool_output", "message_output_created"]
    # Both turns were streamed from the upstream.
    assert [r["body"].get("stream") for r in env.upstream(alias).requests()] == [True, True]


def test_run_sync_the_same(env: Env) -> None:
    """`Runner.run_sync` runs on its thread's default event loop and leaves it open: a thread of
    its own, whose loop is closed after, keeps it apart from the test's."""

    weather = Weather()

    def run() -> RunResult:
        client = env.async_client()
        try:
            return Runner.run_sync(weather_agent(client, FW, weather.tool()), ASK, run_config=RUN)
        finally:
            loop = asyncio.get_event_loop_policy().get_event_loop()
            loop.run_until_complete(client.close())
            loop.close()

    with ThreadPoolExecutor(1) as pool:
        result = pool.submit(run).result()
    check_run(env, FW, weather, result)


# ---------------------------------------------------------------- the real vLLM stack


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest) -> Stack:
    """The session's vLLM stack; without vLLM a skip or a failure, as the other vLLM modules
    (require_vllm) have it, before the stack is asked for (this module's other tests run on
    the scripted upstreams, so the check is not at import)."""
    require_vllm()
    found: Stack = request.getfixturevalue("vllm_stack")
    return found


@dataclass
class Cities:
    """A function tool of one field, an enum: the forced call's guided JSON has little to write."""

    calls: list[Json] = field(default_factory=list)

    def tool(self) -> FunctionTool:
        @function_tool
        def pick_city(city: Literal["Paris", "Rome"]) -> str:
            """Pick a city for the forecast."""
            self.calls.append({"city": city})
            return f"The forecast for {city}"

        return pick_city


# The tiny model is random: the call is forced, greedy, with the whitespace tokens away (vLLM's
# logit_bias, an extra the gateway passes to vLLM targets) so that its JSON ends within the bound.
FORCED = ModelSettings(
    tool_choice="required",
    temperature=0,
    max_tokens=TOOL_TOKENS,
    parallel_tool_calls=False,
    extra_body={"logit_bias": NO_WHITESPACE},
)


@pytest.mark.parametrize("path", PATHS)
async def test_a_forced_tool_call_on_vllm(stack: Stack, path: str) -> None:
    cities = Cities()
    tool = cities.tool()
    async with stack.async_client(path) as client:
        agent = Agent(
            name="cities",
            instructions="Pick a city.",
            model=OpenAIResponsesModel(model=MODEL, openai_client=client),
            tools=[tool],
            model_settings=FORCED,
            tool_use_behavior="stop_on_first_tool",
        )
        result = await Runner.run(agent, "Which city?", run_config=RUN)
    (args,) = cities.calls
    jsonschema.validate(args, tool.params_json_schema)
    assert result.final_output == f"The forecast for {args['city']}"
    (call,) = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    assert isinstance(call.raw_item, ResponseFunctionToolCall)
    assert json.loads(call.raw_item.arguments) == args
    # One model request: the run stopped on the tool's output, within the bound.
    usage = result.context_wrapper.usage
    assert usage.requests == 1 and 0 < usage.output_tokens <= TOOL_TOKENS
