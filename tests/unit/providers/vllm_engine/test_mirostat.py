"""providers.vllm_engine.mirostat (pure Mirostat v2 maths and per-sequence state) and
mirostat_lp.MirostatLP driven through vLLM's adapter without an engine."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from providers.vllm_engine.mirostat import (
    DEFAULT_LR,
    LOGITS_PROCESSOR,
    LR_KEY,
    TARGET_KEY,
    MirostatState,
    from_extra_args,
    keep_mask,
    surprises,
    update_mu,
    validate,
)

REPO = Path(__file__).resolve().parents[4]
# p = 1/2, 1/4, 1/8, 1/8: surprises of exactly 1, 2, 3 and 3 bits.
HALVES = torch.tensor([0.5, 0.25, 0.125, 0.125]).log()
BAD_NUMBERS = [0, 0.0, -1, -0.5, math.nan, math.inf, -math.inf, 10**400, "5", None, True, [1]]


def zipf_logits(vocab: int = 400, exponent: float = 1.1) -> torch.Tensor:
    return -exponent * torch.arange(1, vocab + 1, dtype=torch.float32).log()


# validate / from_extra_args


def test_validate_accepts_positive_finite_numbers() -> None:
    assert validate(5, 0.1) == (5.0, 0.1)
    assert validate(0.25) == (0.25, DEFAULT_LR)
    result = validate(3, 2)
    assert all(type(v) is float for v in result)


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_validate_rejects_bad_target_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=TARGET_KEY):
        validate(bad, 0.1)


@pytest.mark.parametrize("bad", BAD_NUMBERS, ids=repr)
def test_validate_rejects_bad_lr_naming_it(bad: Any) -> None:
    with pytest.raises(ValueError, match=LR_KEY):
        validate(5.0, bad)


def test_from_extra_args() -> None:
    assert from_extra_args(None) is None
    assert from_extra_args({}) is None
    assert from_extra_args({"other": 1}) is None
    assert from_extra_args({TARGET_KEY: None}) is None  # null target = off, as in Fireworks
    assert from_extra_args({TARGET_KEY: 4}) == (4.0, DEFAULT_LR)
    assert from_extra_args({TARGET_KEY: 4, LR_KEY: None}) == (4.0, DEFAULT_LR)
    assert from_extra_args({TARGET_KEY: 4, LR_KEY: 0.5}) == (4.0, 0.5)
    with pytest.raises(ValueError, match=LR_KEY):
        from_extra_args({LR_KEY: 0.5})
    with pytest.raises(ValueError, match=TARGET_KEY):
        from_extra_args({TARGET_KEY: -1})


def test_import_pulls_in_neither_vllm_nor_torch() -> None:
    code = (
        "import sys, providers.vllm_engine.mirostat\n"
        "assert not {'vllm', 'torch'} & set(sys.modules), sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


# truncation


def test_surprises_are_bits() -> None:
    assert surprises(HALVES).tolist() == pytest.approx([1.0, 2.0, 3.0, 3.0])


@pytest.mark.parametrize(
    ("mu", "kept"),
    [(3.0, [0, 1, 2, 3]), (2.5, [0, 1]), (2.0, [0, 1]), (1.0, [0]), (0.5, [0]), (-3.0, [0])],
)
def test_keep_mask_keeps_surprise_at_most_mu_or_the_argmax(mu: float, kept: list[int]) -> None:
    # The logits are shifted: only probabilities matter.
    mask = keep_mask(surprises(HALVES + 7.0), mu)
    assert mask.nonzero().squeeze(-1).tolist() == kept


def test_keep_mask_keeps_tied_top_tokens_together() -> None:
    mask = keep_mask(surprises(torch.tensor([2.0, 2.0, 1.0])), 0.0)
    assert mask.tolist() == [True, True, False]


def test_truncation_matches_the_definition_on_random_rows() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(200):
        logits = torch.randn(50, generator=gen) * 3
        mu = float(torch.rand(1, generator=gen)) * 8
        expected = surprises(logits) <= mu
        if not expected.any():
            expected = torch.zeros(50, dtype=torch.bool)
            expected[logits.argmax()] = True
        state = MirostatState(target=mu / 2, lr=0.1)  # μ starts at 2τ = mu
        out = state([], logits.clone())
        assert torch.equal(out.isfinite(), expected)
        assert torch.equal(out[expected], logits[expected])  # survivors keep their logits


def test_truncate_works_in_place_and_leaves_unusable_rows_alone() -> None:
    logits = HALVES.clone()
    state = MirostatState(target=1.0, lr=0.1)  # μ = 2 keeps tokens 0 and 1
    assert state([], logits) is logits
    assert logits.isfinite().tolist() == [True, True, False, False]
    dead = torch.full((4,), -math.inf)
    assert torch.equal(MirostatState(1.0, 0.1)([], dead.clone()), dead)


# μ and its updates


def test_state_starts_at_twice_the_target() -> None:
    state = MirostatState(target=2.5, lr=0.3)
    assert (state.mu, state.target, state.lr) == (5.0, 2.5, 0.3)
    state([], HALVES.clone())  # nothing sampled yet: no update
    assert state.mu == 5.0 and state.last_surprise is None


def test_update_direction() -> None:
    assert update_mu(4.0, surprise=5.0, target=3.0, lr=0.1) == pytest.approx(3.8)
    assert update_mu(4.0, surprise=1.0, target=3.0, lr=0.1) == pytest.approx(4.2)
    assert update_mu(4.0, surprise=3.0, target=3.0, lr=0.1) == 4.0


def test_state_updates_from_the_previous_steps_token() -> None:
    state = MirostatState(target=1.5, lr=0.1)  # μ = 3 keeps all four tokens
    out: list[int] = []
    state(out, HALVES.clone())
    out.append(3)  # surprise 3 > τ: μ falls
    state(out, HALVES.clone())
    assert state.last_surprise == pytest.approx(3.0)
    assert state.mu == pytest.approx(3.0 - 0.1 * (3.0 - 1.5))
    mu = state.mu
    out.append(0)  # μ = 2.85 kept tokens 0 and 1: token 0 had p = 2/3, a surprise below τ
    state(out, HALVES.clone())
    assert state.last_surprise == pytest.approx(math.log2(3 / 2))
    assert state.mu == pytest.approx(mu - 0.1 * (math.log2(3 / 2) - 1.5))
    assert state.mu > mu


def test_surprise_is_measured_on_the_renormalised_survivors() -> None:
    state = MirostatState(target=1.0, lr=0.1)  # μ = 2 keeps p = 1/2, 1/4 → 2/3, 1/3
    state([], HALVES.clone())
    state([1], HALVES.clone())
    assert state.last_surprise == pytest.approx(math.log2(3))  # not 2 bits (the original p)
    assert state.mu == pytest.approx(2.0 - 0.1 * (math.log2(3) - 1.0))


def test_no_update_without_exactly_one_new_known_survivor() -> None:
    state = MirostatState(target=1.0, lr=0.1)
    state([], HALVES.clone())
    state([], HALVES.clone())  # e.g. a partial prefill whose token vLLM discarded
    assert state.mu == 2.0
    state([0, 1], HALVES.clone())  # two new tokens: which distribution made the first is unknown
    assert state.mu == 2.0
    state([0, 1, 3], HALVES.clone())  # token 3 was truncated away: nothing to learn
    assert state.mu == 2.0 and state.last_surprise is None
    state([0, 1, 3, 0], HALVES.clone())
    assert state.mu != 2.0


def _run(state: MirostatState | None, logits: torch.Tensor, steps: int) -> list[float]:
    """Sample `steps` tokens; returns each token's surprise under the unmodified distribution."""
    gen = torch.Generator().manual_seed(1234)
    original = surprises(logits)
    out: list[int] = []
    for _ in range(steps):
        row = logits.clone() if state is None else state(out, logits.clone())
        token = int(torch.multinomial(row.softmax(-1), 1, generator=gen))
        out.append(token)
    return [float(original[t]) for t in out]


def test_mean_surprise_converges_to_the_target() -> None:
    logits = zipf_logits()
    entropy = float((logits.softmax(-1) * surprises(logits)).sum())
    target = 3.0
    assert entropy > target + 2  # plain sampling is far more surprising than the target

    state = MirostatState(target=target, lr=0.1)
    observed: list[float] = []
    gen = torch.Generator().manual_seed(7)
    out: list[int] = []
    for _ in range(3000):
        row = state(out, logits.clone())
        out.append(int(torch.multinomial(row.softmax(-1), 1, generator=gen)))
        if state.last_surprise is not None:
            observed.append(state.last_surprise)
    tail = observed[-2000:]
    assert sum(tail) / len(tail) == pytest.approx(target, abs=0.2)

    plain = _run(None, logits, 2000)
    steered = _run(MirostatState(target=target, lr=0.1), logits, 2000)
    assert sum(plain) / len(plain) == pytest.approx(entropy, abs=0.3)
    assert sum(steered) / len(steered) < sum(plain) / len(plain) - 1.5


# MirostatLP through vLLM's AdapterLogitsProcessor (no engine: the adapter ignores its config)


@pytest.fixture(scope="module")
def vllm_sampling() -> Any:
    return pytest.importorskip("vllm.sampling_params")


def _lp() -> Any:
    from providers.vllm_engine.mirostat_lp import MirostatLP

    return MirostatLP(None, torch.device("cpu"), False)  # type: ignore[arg-type]


def test_lp_is_argmax_invariant(vllm_sampling: Any) -> None:
    assert _lp().is_argmax_invariant() is True


def test_lp_factory_only_for_mirostat_requests(vllm_sampling: Any) -> None:
    sp = vllm_sampling.SamplingParams
    lp = _lp()
    assert lp.new_req_logits_processor(sp()) is None
    assert lp.new_req_logits_processor(sp(extra_args={"other": 1})) is None
    state = lp.new_req_logits_processor(sp(extra_args={TARGET_KEY: 4.0}))
    assert isinstance(state, MirostatState)
    assert (state.target, state.lr, state.mu) == (4.0, DEFAULT_LR, 8.0)


def test_lp_validation_errors_become_vllm_validation_errors(vllm_sampling: Any) -> None:
    from vllm.exceptions import VLLMValidationError
    from vllm.v1.sample.logits_processor import validate_logits_processors_parameters

    from providers.vllm_engine.mirostat_lp import MirostatLP

    bad = vllm_sampling.SamplingParams(extra_args={TARGET_KEY: 0})
    with pytest.raises(ValueError, match=TARGET_KEY):
        MirostatLP.validate_params(bad)
    # The FQCN string is what the engine is configured with; vLLM loads the class from it.
    with pytest.raises(VLLMValidationError, match=TARGET_KEY):
        validate_logits_processors_parameters([LOGITS_PROCESSOR], bad)
    good = vllm_sampling.SamplingParams(extra_args={TARGET_KEY: 3.0, LR_KEY: 0.2})
    validate_logits_processors_parameters([LOGITS_PROCESSOR], good)
    validate_logits_processors_parameters([LOGITS_PROCESSOR], vllm_sampling.SamplingParams())


def test_lp_gives_every_sequence_its_own_state(vllm_sampling: Any) -> None:
    from vllm.v1.sample.logits_processor import BatchUpdate

    shared = vllm_sampling.SamplingParams(extra_args={TARGET_KEY: 0.5})  # μ = 1 keeps the top
    plain = vllm_sampling.SamplingParams()
    outs: list[list[int]] = [[], [], []]
    lp = _lp()
    # Rows 0 and 2 share one SamplingParams object, as n > 1 children without a seed do.
    added = [(0, shared, None, outs[0]), (1, plain, None, outs[1]), (2, shared, None, outs[2])]
    lp.update_state(BatchUpdate(batch_size=3, removed=[], added=added, moved=[]))
    assert sorted(lp.req_info) == [0, 2]
    assert lp.req_info[0].func is not lp.req_info[2].func

    logits = HALVES.repeat(3, 1)
    result = lp.apply(logits)
    assert result[1].tolist() == HALVES.tolist()  # untouched
    assert result[0].isfinite().tolist() == [True, False, False, False]
    assert torch.equal(result[0], result[2])

    outs[0].append(0)  # only sequence 0 sampled a token since: only its μ moves
    lp.update_state(None)
    lp.apply(HALVES.repeat(3, 1))
    assert lp.req_info[0].func.mu != 1.0 and lp.req_info[2].func.mu == 1.0
