"""vLLM's own rules between the fields of a completion request, shared by the paths that serve
vLLM's extras: the in-process engine and vLLM's server (the `vllm-server` dialect).

The fields' types and ranges are checked for every request from the declaration
(`core.completions`); what is here holds only where vLLM serves the request: beam search and
what it ignores, `logprob_token_ids`, `min_tokens` against `max_tokens`, prompt logprobs in a
stream.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from core.completions import DEFAULT_MAX_TOKENS, NO_PROMPT
from core.errors import InvalidRequest

MAX_LOGPROB_TOKEN_IDS = 128  # vLLM's (sampling_params.MAX_LOGPROB_TOKEN_IDS)
# What beam search leaves out: vLLM's server maps a beam-search request with
# `to_beam_search_params` (n, max_tokens, temperature, length_penalty, ignore_eos,
# include_stop_str_in_output, skip_special_tokens) and ignores everything else. A field here set
# to anything but its neutral values would change nothing, so it is refused rather than
# silently lost.
BEAM_IGNORES: Mapping[str, tuple[Any, ...]] = MappingProxyType(
    {
        "best_of": (1,),
        "stop": ("", []),
        "stop_token_ids": ([],),
        "min_tokens": (0,),
        "top_p": (1,),
        "top_k": (0, -1),
        "min_p": (0,),
        "presence_penalty": (0,),
        "frequency_penalty": (0,),
        "repetition_penalty": (1,),
        "logit_bias": ({},),
        "bad_words": ([],),
        "allowed_token_ids": (),
        "structured_outputs": (),
        "response_format": ({"type": "text"},),
        "vllm_xargs": ({},),
        "mirostat_target": (),
        "mirostat_lr": (),
        "prompt_logprobs": (),
        "logprob_token_ids": ([],),
        "spaces_between_special_tokens": (True,),
    }
)


def _beam_search_checks(f: Mapping[str, Any]) -> None:
    if f.get("stream"):
        raise InvalidRequest(
            "Streaming is not supported with beam search.", param="use_beam_search"
        )
    if f.get("echo") and f.get("logprobs") is not None:
        raise InvalidRequest(
            "'echo' with 'logprobs' is not supported with beam search: beam search does not "
            "compute prompt logprobs.",
            param="echo",
        )
    for name, neutral in BEAM_IGNORES.items():
        if name in f and f[name] not in neutral:
            raise InvalidRequest(
                f"'{name}' has no effect with beam search, which applies only n (the beam "
                "width), max_tokens, temperature, length_penalty, ignore_eos, "
                "include_stop_str_in_output and skip_special_tokens.",
                param=name,
            )


def _logprob_token_ids_checks(f: Mapping[str, Any]) -> None:
    """vLLM's: the listed ids' logprobs replace the top `logprobs`, so logprobs must be asked
    for, and there must be generated tokens to score."""
    if f.get("logprobs") is None:
        raise InvalidRequest(
            "'logprobs' must be set when using 'logprob_token_ids'.", param="logprob_token_ids"
        )
    if f.get("echo") and f.get("max_tokens") == 0:
        raise InvalidRequest(
            "'logprob_token_ids' is not supported with 'echo' and 'max_tokens' 0: no tokens are "
            "generated.",
            param="logprob_token_ids",
        )
    if len(f["logprob_token_ids"]) > MAX_LOGPROB_TOKEN_IDS:
        raise InvalidRequest(
            f"'logprob_token_ids' may list at most {MAX_LOGPROB_TOKEN_IDS} token ids.",
            param="logprob_token_ids",
        )


def check(f: Mapping[str, Any]) -> None:
    """vLLM's own checks between a completion request's fields (its CompletionRequest's
    validators, SamplingParams'), as 400s naming the field."""
    if f.get("prompt") == "":
        raise InvalidRequest(NO_PROMPT, param="prompt")
    _shared_checks(f)
    if f.get("use_beam_search"):
        _beam_search_checks(f)
    _min_tokens(f, "max_tokens", f.get("max_tokens", DEFAULT_MAX_TOKENS))
    if f.get("logprob_token_ids"):
        _logprob_token_ids_checks(f)
    _allowed_token_ids(f)


def check_chat(f: Mapping[str, Any]) -> None:
    """The same for a chat request (vLLM's ChatCompletionRequest): its bound on tokens is
    `max_completion_tokens` or `max_tokens`, none meaning what the window leaves; `logprobs` is a
    flag; `echo` repeats the last message, with or without logprobs."""
    _shared_checks(f)
    if f.get("use_beam_search"):
        _beam_search_checks({k: v for k, v in f.items() if k != "echo"})
    bound = "max_completion_tokens" if "max_completion_tokens" in f else "max_tokens"
    if bound in f:
        _min_tokens(f, bound, f[bound])
    if f.get("logprob_token_ids") and not f.get("logprobs"):
        raise InvalidRequest(
            "'logprobs' must be true when using 'logprob_token_ids'.", param="logprob_token_ids"
        )
    if len(f.get("logprob_token_ids") or ()) > MAX_LOGPROB_TOKEN_IDS:
        raise InvalidRequest(
            f"'logprob_token_ids' may list at most {MAX_LOGPROB_TOKEN_IDS} token ids.",
            param="logprob_token_ids",
        )
    _allowed_token_ids(f)


def _shared_checks(f: Mapping[str, Any]) -> None:
    prompt_logprobs = f.get("prompt_logprobs")
    if prompt_logprobs is not None and f.get("stream") and prompt_logprobs != 0:
        raise InvalidRequest(
            "'prompt_logprobs' are not available when 'stream' is enabled.",
            param="prompt_logprobs",
        )
    if not f.get("use_beam_search") and f.get("length_penalty", 1) != 1:
        raise InvalidRequest(
            "'length_penalty' applies only to beam search ('use_beam_search': true).",
            param="length_penalty",
        )


def _allowed_token_ids(f: Mapping[str, Any]) -> None:
    if f.get("allowed_token_ids") == []:
        raise InvalidRequest("'allowed_token_ids' must not be empty.", param="allowed_token_ids")


def _min_tokens(f: Mapping[str, Any], bound: str, max_tokens: int) -> None:
    min_tokens = f.get("min_tokens", 0)
    if min_tokens > max(max_tokens, 1):
        raise InvalidRequest(
            f"'min_tokens' ({min_tokens}) must be less than or equal to '{bound}' ({max_tokens}).",
            param="min_tokens",
        )
