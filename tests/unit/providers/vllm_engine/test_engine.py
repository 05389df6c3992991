"""The engine adapter's pure parts, without an engine: the context fit, n/best_of fan-out, the
lifecycle's failure reporting, and vLLM's exceptions as gateway errors."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest

from core.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    ServiceUnavailable,
    UpstreamError,
)
from providers import registry
from providers.vllm_engine import engine as engine_mod
from providers.vllm_engine.adapter import VllmEngineProvider
from providers.vllm_engine.engine import Engine, engine_args
from providers.vllm_engine.fanout import Fanout, fanout, mean_logprob, select
from providers.vllm_engine.mirostat import LOGITS_PROCESSOR
from providers.vllm_engine.settings import EngineSettings
from providers.vllm_engine.shared import Slot
from providers.vllm_engine.window import Overflow, fit, fit_chat

SETTINGS = EngineSettings("./models/tiny", {"max_model_len": 64})

# ---------------------------------------------------------------- context


def test_fit_keeps_max_tokens_that_fit() -> None:
    assert fit([10, 50], 14, 64, how="error") == [14, 14]
    assert fit([10], 54, 64, how="error") == [54]  # exactly the window


def test_fit_error_names_both_numbers() -> None:
    with pytest.raises(ContextLengthExceeded) as caught:
        fit([60], 16, 64, how="error")
    err = caught.value
    assert err.param == "prompt" and err.code == "context_length_exceeded"
    assert "maximum context length is 64 tokens" in err.message
    assert "you requested 76 tokens (60 in your prompt; 16 for the completion)" in err.message


def test_fit_truncate_lowers_max_tokens_per_prompt() -> None:
    assert fit([60, 10, 63], 16, 64, how="truncate") == [4, 16, 1]


@pytest.mark.parametrize("how", ["error", "truncate", "vllm"])
def test_a_prompt_that_fills_the_window_is_an_error_either_way(how: Overflow) -> None:
    for length in (64, 100):
        with pytest.raises(ContextLengthExceeded) as caught:
            fit([5, length], 8, 64, how)
        assert f"({length} in your prompt 1;" in caught.value.message


def test_unasked_the_room_left_is_vllms_own() -> None:
    """vLLM lowers a bound larger than the room left, and refuses one larger than the window
    (in its words, naming the bound)."""
    assert fit([60, 10, 63], 16, 64, "vllm") == [4, 16, 1]
    assert fit_chat(60, 16, 64, "vllm", "max_completion_tokens") == 4
    assert fit_chat(60, None, 64, "vllm", "max_tokens") == 4
    with pytest.raises(InvalidRequest) as caught:
        fit_chat(10, 65, 64, "vllm", "max_completion_tokens")
    assert (caught.value.param, caught.value.message) == (
        "max_completion_tokens",
        "max_completion_tokens=65 cannot be greater than max_model_len=64. Please request "
        "fewer output tokens.",
    )
    assert not isinstance(caught.value, ContextLengthExceeded)
    with pytest.raises(InvalidRequest) as caught:
        fit([1], 65, 64, "vllm")
    assert caught.value.param == "max_tokens"
    with pytest.raises(ContextLengthExceeded):
        fit_chat(60, 16, 64, "error", "max_tokens")


def test_echo_with_max_tokens_zero_needs_room_for_the_engines_one_token() -> None:
    assert fit([63], 0, 64, how="error") == [0]
    with pytest.raises(ContextLengthExceeded):
        fit([64], 0, 64, how="error")


# ---------------------------------------------------------------- fan-out


@dataclass
class Seq:
    index: int
    token_ids: list[int] = field(default_factory=lambda: [1, 2])
    cumulative_logprob: float | None = None


def test_fanout_table() -> None:
    assert fanout(3, None, 1.0) == Fanout(generate=3, keep=3, rank=False, copies=1)
    assert fanout(2, 5, 0.7) == Fanout(generate=5, keep=2, rank=True, copies=1)
    assert fanout(2, 2, 0.7) == Fanout(generate=2, keep=2, rank=False, copies=1)
    # greedy: one sequence, repeated; best_of has nothing to choose from
    assert fanout(3, 5, 0.0) == Fanout(generate=1, keep=3, rank=False, copies=3)
    assert fanout(1, None, 1e-6) == Fanout(generate=1, keep=1, rank=False, copies=1)


def test_select_ranks_by_mean_logprob_and_keeps_ties_in_order() -> None:
    seqs = [
        Seq(0, [1, 2], -4.0),  # mean -2
        Seq(1, [1, 2, 3, 4], -4.0),  # mean -1
        Seq(2, [1], -1.0),  # mean -1 (tie with 1, later)
        Seq(3, [], None),  # nothing generated: never wins
    ]
    picked = select(list(reversed(seqs)), fanout(2, 4, 1.0))
    assert [s.index for s in picked] == [1, 2]
    assert mean_logprob(seqs[3]) == float("-inf")


def test_select_repeats_a_greedy_sequence() -> None:
    one = Seq(0)
    assert select([one], fanout(3, None, 0.0)) == [one, one, one]
    assert [s.index for s in select([Seq(1), Seq(0)], fanout(2, None, 1.0))] == [0, 1]


# ---------------------------------------------------------------- lifecycle


def test_the_provider_is_registered_and_built_without_vllm() -> None:
    provider = registry.build("local", {"type": "vllm", "model": "./m"}, "providers.local")
    assert isinstance(provider, VllmEngineProvider)
    assert not provider.ready()


def test_engine_args_always_load_the_mirostat_processor() -> None:
    args = engine_args(SETTINGS)
    assert args == {
        "scheduling_policy": "priority",  # a batch's lines after live requests
        "max_model_len": 64,
        "model": "./models/tiny",
        "logits_processors": [LOGITS_PROCESSOR],
    }


async def test_starting_engine_answers_503_with_retry_after() -> None:
    engine = Engine("local", SETTINGS)
    with pytest.raises(ServiceUnavailable) as caught:
        _ = engine.llm
    assert "still starting" in caught.value.message
    assert caught.value.headers == {"retry-after": "5"}


async def test_missing_vllm_is_said_clearly(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_vllm(_: EngineSettings, slot: Slot | None) -> None:
        raise ModuleNotFoundError("No module named 'vllm'", name="vllm")

    monkeypatch.setattr(engine_mod, "build_engine", no_vllm)
    engine = Engine("local", SETTINGS)
    with caplog.at_level(logging.ERROR, logger="providers.vllm_engine"):
        await engine.start()
        await engine.aclose()
    assert not engine.ready()
    assert engine.failure is not None and "vLLM is not installed" in engine.failure
    assert "'local'" in engine.failure and "make install" in engine.failure
    assert engine.failure in caplog.text
    with pytest.raises(ServiceUnavailable) as caught:
        _ = engine.llm
    assert "vLLM is not installed" in caught.value.message


async def test_a_failed_start_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    def bad_args(_: EngineSettings, slot: Slot | None) -> None:
        raise TypeError("__init__() got an unexpected keyword argument 'max_model_lenn'")

    monkeypatch.setattr(engine_mod, "build_engine", bad_args)
    engine = Engine("local", SETTINGS)
    await engine.start()
    await engine.aclose()
    assert engine.failure is not None and "max_model_lenn" in engine.failure


# ---------------------------------------------------------------- engine errors


def test_engine_errors_map_to_the_error_tree() -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.engine.exceptions import EngineDeadError

    from providers.vllm_engine.errors import engine_error

    invalid = engine_error(VLLMValidationError("top_k bad", parameter="top_k"), "local/m")
    assert isinstance(invalid, InvalidRequest) and invalid.param == "top_k"
    assert isinstance(
        engine_error(ValueError("Token id 999 is out of vocabulary"), "l"), InvalidRequest
    )
    dead = engine_error(EngineDeadError(), "local/m")
    assert isinstance(dead, UpstreamError) and dead.status == 503 and "local/m" in dead.message
    other = engine_error(RuntimeError("boom"), "local/m")
    assert other.status == 500 and "boom" not in other.message
