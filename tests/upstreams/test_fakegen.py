"""The fake model's promises that end-to-end tests rely on (no server)."""

from __future__ import annotations

from tests.upstreams.fakegen import (
    WORDS,
    GenSpec,
    best_of,
    expected_text,
    generate,
    prompt_from_ids,
    prompt_from_text,
    split_words,
)


def test_words_round_trip_and_count() -> None:
    text = "  Say hello\tto the  world \n"
    tokens = split_words(text)
    assert "".join(tokens) == text
    assert len(tokens) == len(text.split())
    assert len(prompt_from_ids([5, 6, 7])) == 3


def test_every_word_appears_within_eight_tokens() -> None:
    for c in range(4):
        text = expected_text("any prompt", c, max_tokens=len(WORDS))
        assert sorted(split_words(text)) == sorted(WORDS)


def test_choices_differ_and_seed_repeats() -> None:
    texts = {expected_text("p", c, 8, seed=3) for c in range(8)}
    assert len(texts) == 8
    assert expected_text("p", 1, 8, seed=3) == expected_text("p", 1, 8, seed=3)


def test_stop_excluded_or_included() -> None:
    prompt = prompt_from_text("p")
    cut = generate(prompt, 0, GenSpec(16, (" gamma",)))
    kept = generate(prompt, 0, GenSpec(16, (" gamma",), include_stop=True))
    assert cut.finish_reason == kept.finish_reason == "stop"
    assert " gamma" not in cut.text
    assert kept.text == cut.text + " gamma"
    assert cut.completion_tokens == kept.completion_tokens == len(kept.tokens)


def test_stop_inside_a_token_shortens_it() -> None:
    sample = generate(prompt_from_text("p"), 0, GenSpec(16, ("mm",)))
    assert sample.text.endswith(" ga")
    assert "".join(t.text for t in sample.tokens) == sample.text


def test_length_and_eos() -> None:
    prompt = prompt_from_text("p")
    assert generate(prompt, 0, GenSpec(5)).finish_reason == "length"
    eos = generate(prompt, 0, GenSpec(5, eos_after=2))
    assert (eos.finish_reason, eos.completion_tokens) == ("stop", 2)


def test_best_of_prefers_the_highest_candidate() -> None:
    prompt = prompt_from_text("p")
    spec = GenSpec(12, (" delta",))  # stops make lengths differ; ranking must not care
    ranked = best_of(prompt, 2, 5, spec)
    assert [s.candidate for s in ranked] == [4, 3]
