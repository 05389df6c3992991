"""Dialect tables of the OpenAI-compatible adapter, and how prepare() maps a request."""

from __future__ import annotations

from datetime import date
from typing import Any

import orjson
import pytest

from core.chat import validate_chat
from core.completions import FIELDS, SUB_FIELDS, VLLM_FIELDS, RequestLimits, validate_completion
from core.embeddings import validate_embedding
from core.errors import ConfigError, InvalidRequest, UnsupportedParameter
from core.provider import Target
from providers.openai_compat import OpenAICompatProvider
from providers.openai_compat.adapter import UpstreamCompletion
from providers.openai_compat.dialects import DIALECTS
from providers.rules.params import DROP, EMULATE, REJECT, UNKNOWN, Action, apply_rules, passes

TAGS = ("openai", "fireworks", "vllm-server", "openai-compatible", "azure-openai")


def request(**fields: Any) -> Any:
    return validate_completion({"model": "alias", "prompt": "hi", **fields}, RequestLimits())


def provider(tag: str) -> OpenAICompatProvider:
    return OpenAICompatProvider.from_config(
        "up", tag, {"type": tag, "base_url": "http://127.0.0.1:9/v1"}, "providers.up"
    )


def target(policy: str = "reject") -> Target:
    return Target("alias", "up", "acct/model-x", 30.0, policy)  # type: ignore[arg-type]


def body_of(tag: str, policy: str = "reject", **fields: Any) -> dict[str, Any]:
    prepared = provider(tag).prepare(request(**fields), target(policy))
    plan: UpstreamCompletion = prepared.state
    assert orjson.loads(plan.payload) == plan.body  # serialized once, the same thing
    return dict(plan.body)


# ---------------------------------------------------------------- coverage


def test_every_tag_has_a_dialect() -> None:
    assert set(DIALECTS) == set(TAGS) == set(OpenAICompatProvider.type_tags)


@pytest.mark.parametrize("tag", TAGS)
def test_every_field_has_a_rule_in_every_dialect(tag: str) -> None:
    rules = DIALECTS[tag].rules
    missing = [name for name in (*FIELDS, *SUB_FIELDS) if name not in rules]
    assert missing == []
    assert UNKNOWN in rules


OPENAI_ACTIONS = {
    "best_of": Action.PASS,
    "suffix": Action.PASS,
    "top_k": Action.REJECT,
    "mirostat_target": Action.REJECT,
    "response_format": Action.REJECT,
    "context_length_exceeded_behavior": Action.EMULATE,
    UNKNOWN: Action.REJECT,
}
EXPECTED: dict[str, dict[str, Action]] = {
    "openai": OPENAI_ACTIONS,
    "fireworks": {
        "best_of": Action.EMULATE,
        "suffix": Action.REJECT,
        "stream_options": Action.EMULATE,
        "top_k": Action.PASS,
        "mirostat_lr": Action.PASS,
        "ignore_eos": Action.PASS,
        "context_length_exceeded_behavior": Action.PASS,
        UNKNOWN: Action.REJECT,
    },
    "vllm-server": {
        "best_of": Action.EMULATE,
        "suffix": Action.REJECT,
        "top_p": Action.CONVERT,
        "stream_options": Action.CONVERT,
        "response_format": Action.CONVERT,
        "mirostat_target": Action.REJECT,
        "min_p": Action.PASS,
        "context_length_exceeded_behavior": Action.EMULATE,
        UNKNOWN: Action.PASS,
    },
    "openai-compatible": {
        "best_of": Action.EMULATE,
        "top_k": Action.PASS,
        "mirostat_target": Action.REJECT,
        "response_format": Action.PASS,
        "context_length_exceeded_behavior": Action.EMULATE,
        UNKNOWN: Action.PASS,
    },
    "azure-openai": OPENAI_ACTIONS,  # OpenAI's API, served by Microsoft
}


@pytest.mark.parametrize("tag", TAGS)
def test_actions(tag: str) -> None:
    rules = DIALECTS[tag].rules
    assert {name: rules[name].action for name in EXPECTED[tag]} == EXPECTED[tag]


# vLLM's extras: passed on to vLLM servers (and lenient servers, mostly vLLM-based); refused by
# OpenAI and Fireworks, whose schemas do not have them; the engine's own table is tested apart.
VLLM_EXTRA_ACTIONS = {
    "openai": Action.REJECT,
    "fireworks": Action.REJECT,
    "vllm-server": Action.PASS,
    "openai-compatible": Action.PASS,
    "azure-openai": Action.REJECT,
}


@pytest.mark.parametrize("tag", TAGS)
def test_vllm_extras_have_a_row_in_every_dialect(tag: str) -> None:
    rules = DIALECTS[tag].rules
    actions = {name: rules[name].action for name in VLLM_FIELDS}
    assert set(actions.values()) == {VLLM_EXTRA_ACTIONS[tag]}


VLLM_EXTRAS_SAMPLE: dict[str, Any] = {
    "min_tokens": 2, "stop_token_ids": [7], "prompt_logprobs": 1, "return_token_ids": True,
    "structured_outputs": {"choice": ["a", "b"]}, "vllm_xargs": {"k": 1}, "priority": -1,
    "logprobs": 12,
}  # fmt: skip


def test_vllm_extras_pass_to_a_vllm_server_unchanged() -> None:
    body = body_of("vllm-server", **VLLM_EXTRAS_SAMPLE)
    assert {k: body[k] for k in VLLM_EXTRAS_SAMPLE} == VLLM_EXTRAS_SAMPLE


REFUSED = [
    ("openai", "min_tokens"), ("fireworks", "min_tokens"),
    ("openai", "logprobs"), ("openai-compatible", "logprobs"),
]  # fmt: skip


@pytest.mark.parametrize(("tag", "param"), REFUSED)
def test_vllm_extras_elsewhere_are_400s_naming_them(tag: str, param: str) -> None:
    """A refused extra under `unsupported_params: reject`, and OpenAI's cap of 5 logprobs for
    every target but vLLM."""
    with pytest.raises(InvalidRequest) as exc:
        body_of(tag, **{param: VLLM_EXTRAS_SAMPLE[param]})
    assert exc.value.param == param and exc.value.status == 400


def test_ranges() -> None:
    fw = DIALECTS["fireworks"].rules
    assert (fw["top_k"].lo, fw["top_k"].hi) == (0, 100)
    assert (fw["repetition_penalty"].lo, fw["repetition_penalty"].hi) == (0.0, 2.0)
    assert (fw["logprobs"].lo, fw["logprobs"].hi) == (0, 5)
    assert DIALECTS["vllm-server"].rules["mirostat_lr"].note == "vLLM has no mirostat"


def test_flags() -> None:
    fw = DIALECTS["fireworks"]
    assert (
        fw.stop_may_be_included,
        fw.usage_on_last_chunk,
        fw.needs_explicit_context_behavior,
    ) == (
        True,
        True,
        True,
    )
    for tag in ("openai", "vllm-server", "openai-compatible", "azure-openai"):
        spec = DIALECTS[tag]
        flags = (spec.stop_may_be_included, spec.usage_on_last_chunk)
        assert flags == (False, False)
        assert spec.needs_explicit_context_behavior is False


# ---------------------------------------------------------------- rule application


def test_reject_names_param_and_target() -> None:
    with pytest.raises(UnsupportedParameter) as exc:
        body_of("openai", top_k=5)
    assert exc.value.param == "top_k"
    assert exc.value.status == 400
    assert exc.value.code == "unsupported_parameter"
    assert "up/acct/model-x" in exc.value.message
    assert "not an OpenAI parameter" in exc.value.message


def test_drop_policy_reports_dropped() -> None:
    prepared = provider("fireworks").prepare(request(suffix="x", foo=1, top_k=3), target("drop"))
    assert prepared.dropped == ("suffix", "foo")
    body = prepared.state.body
    assert "suffix" not in body and "foo" not in body
    assert body["top_k"] == 3


def test_unknown_fields_pass_for_vllm_and_are_rejected_by_fireworks() -> None:
    assert body_of("vllm-server", min_tokens=4)["min_tokens"] == 4
    assert body_of("openai-compatible", min_tokens=4)["min_tokens"] == 4
    with pytest.raises(UnsupportedParameter) as exc:
        body_of("fireworks", min_tokens=4)
    assert exc.value.param == "min_tokens"


@pytest.mark.parametrize(
    ("tag", "field", "value"),
    [
        ("fireworks", "top_k", 101),
        ("fireworks", "top_k", -1),
        ("fireworks", "repetition_penalty", 2.5),
    ],
)
def test_out_of_range_is_rejected_never_clamped(tag: str, field: str, value: Any) -> None:
    with pytest.raises(InvalidRequest) as exc:
        body_of(tag, **{field: value})
    assert exc.value.param == field
    assert exc.value.code == "unsupported_value"
    assert "up/acct/model-x" in exc.value.message


def test_in_range_values_pass_unchanged() -> None:
    body = body_of("fireworks", top_k=100, repetition_penalty=2.0, min_p=0.5)
    assert (body["top_k"], body["repetition_penalty"], body["min_p"]) == (100, 2.0, 0.5)


def test_vllm_top_p_zero_becomes_tiny() -> None:
    assert body_of("vllm-server", top_p=0)["top_p"] == 1e-9
    assert body_of("vllm-server", top_p=0.3)["top_p"] == 0.3
    assert body_of("openai", top_p=0)["top_p"] == 0


def test_vllm_response_format_json_object_with_schema() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    body = body_of("vllm-server", response_format={"type": "json_object", "schema": schema})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "schema", "schema": schema},
    }
    plain = body_of("vllm-server", response_format={"type": "json_object"})
    assert plain["response_format"] == {"type": "json_object"}
    fw = body_of("fireworks", response_format={"type": "json_object", "schema": schema})
    assert fw["response_format"] == {"type": "json_object", "schema": schema}


def test_apply_rules_directly_reports_emulated() -> None:
    applied = apply_rules(
        DIALECTS["fireworks"].rules,
        {"best_of": 3, "stream_options": {"include_usage": True}, "n": 2},
        target="t",
        policy="reject",
    )
    assert applied.emulated == frozenset({"best_of", "stream_options"})
    assert applied.body == {"n": 2}


# ---------------------------------------------------------------- the body prepare() builds


def test_body_basics() -> None:
    body = body_of("openai", prompt=["a", "b"], temperature=0.5, stop="\n", user="u1")
    assert body == {
        "model": "acct/model-x",
        "prompt": ["a", "b"],
        "temperature": 0.5,
        "stop": "\n",
        "user": "u1",
        "max_tokens": 16,
        "stream": False,
    }


def test_stream_always_asks_for_usage_except_fireworks() -> None:
    for tag in ("openai", "vllm-server", "openai-compatible", "azure-openai"):
        body = body_of(tag, stream=True)
        assert body["stream_options"] == {"include_usage": True}
        body = body_of(tag, stream=True, stream_options={"include_usage": False})
        assert body["stream_options"] == {"include_usage": True}
    fw = body_of("fireworks", stream=True, stream_options={"include_usage": True})
    assert "stream_options" not in fw
    assert fw["stream"] is True


CONTINUOUS = {"include_usage": True, "continuous_usage_stats": True}


@pytest.mark.parametrize("tag", ["vllm-server", "openai-compatible"])
def test_continuous_usage_goes_where_the_dialect_passes_it(tag: str) -> None:
    assert body_of(tag, stream=True, stream_options=CONTINUOUS)["stream_options"] == CONTINUOUS
    # vLLM reads continuous usage only with include_usage; the caller asked for none.
    alone = {"include_usage": False, "continuous_usage_stats": True}
    assert body_of(tag, stream=True, stream_options=alone)["stream_options"] == {
        "include_usage": True
    }
    prepared = provider(tag).prepare(request(stream=True, stream_options=CONTINUOUS), target())
    assert prepared.state.shape.continuous_usage


@pytest.mark.parametrize("tag", ["openai", "fireworks"])
def test_continuous_usage_elsewhere_is_refused_or_dropped(tag: str) -> None:
    with pytest.raises(InvalidRequest) as exc:
        body_of(tag, stream=True, stream_options=CONTINUOUS)
    assert exc.value.param == "stream_options.continuous_usage_stats"
    assert tag in exc.value.message or "target" in exc.value.message
    req = request(stream=True, stream_options=CONTINUOUS)
    prepared = provider(tag).prepare(req, target("drop"))
    assert prepared.dropped == ("stream_options.continuous_usage_stats",)
    assert not prepared.state.shape.continuous_usage
    assert "continuous_usage_stats" not in prepared.state.body.get("stream_options", {})
    # A null key asks for nothing.
    body_of(
        tag, stream=True, stream_options={"include_usage": True, "continuous_usage_stats": None}
    )


def test_sub_rows_apply_before_their_field() -> None:
    rules = {
        "opts": passes(),
        "opts.a": REJECT,
        "opts.b": EMULATE,
        "opts.c": DROP,
        UNKNOWN: passes(),
    }
    fields = {"opts": {"b": 1, "c": 2, "d": 3}}
    applied = apply_rules(rules, fields, target="t", policy="reject", sub_parents={"opts"})
    assert applied.body == {"opts": {"d": 3}}
    assert applied.emulated == frozenset({"opts.b"}) and applied.dropped == ("opts.c",)
    assert fields == {"opts": {"b": 1, "c": 2, "d": 3}}  # the request is left as it was
    with pytest.raises(UnsupportedParameter) as exc:
        apply_rules(rules, {"opts": {"a": 1}}, target="t", policy="reject", sub_parents={"opts"})
    assert exc.value.param == "opts.a"


def test_fireworks_always_gets_context_behavior() -> None:
    assert body_of("fireworks")["context_length_exceeded_behavior"] == "error"
    body = body_of("fireworks", context_length_exceeded_behavior="truncate")
    assert body["context_length_exceeded_behavior"] == "truncate"


def test_truncate_is_emulated_elsewhere() -> None:
    p = provider("vllm-server").prepare(
        request(context_length_exceeded_behavior="truncate"), target()
    )
    assert p.state.truncate is True
    assert "context_length_exceeded_behavior" not in p.state.body
    p = provider("openai").prepare(request(context_length_exceeded_behavior="error"), target())
    assert p.state.truncate is False
    p = provider("fireworks").prepare(
        request(context_length_exceeded_behavior="truncate"), target()
    )
    assert p.state.truncate is False  # native


def test_best_of_emulation_asks_for_all_candidates() -> None:
    p = provider("vllm-server").prepare(request(n=2, best_of=5), target())
    assert (p.state.body["n"], p.state.body["logprobs"], p.state.best_of) == (5, 0, 5)
    assert "best_of" not in p.state.body
    assert p.state.shape.want_logprobs is False
    p = provider("vllm-server").prepare(request(best_of=3, logprobs=2), target())
    assert (p.state.body["n"], p.state.body["logprobs"], p.state.best_of) == (3, 2, 3)
    assert p.state.shape.want_logprobs is True
    p = provider("openai").prepare(request(best_of=3), target())
    assert (p.state.body["best_of"], p.state.best_of) == (3, 0)  # native
    p = provider("fireworks").prepare(request(n=2, best_of=2), target())
    assert p.state.best_of == 0 and "logprobs" not in p.state.body
    # greedy: every candidate is the same text, so only n are asked for
    p = provider("vllm-server").prepare(request(best_of=3, temperature=0), target())
    assert (p.state.body.get("n", 1), p.state.best_of) == (1, 0)
    assert "logprobs" not in p.state.body


def test_stops_are_cut_only_where_they_may_be_included() -> None:
    assert provider("fireworks").prepare(request(stop=["a", "bc"]), target()).state.shape.stops == (
        "a",
        "bc",
    )
    assert provider("openai").prepare(request(stop=["a"]), target()).state.shape.stops == ()


# ---------------------------------------------------------------- config


def test_from_config_builds_headers_and_url() -> None:
    p = OpenAICompatProvider.from_config(
        "fw",
        "fireworks",
        {
            "type": "fireworks",
            "base_url": "https://api.fireworks.ai/inference/v1/",
            "api_key": "sk-1",
            "headers": {"X-Session-Affinity": "s1", "User-Agent": "me"},
            "max_connections": 8,
            "connect_timeout_s": 2,
        },
        "providers.fw",
    )
    assert p.name == "fw" and p.spec is DIALECTS["fireworks"] and not p.ready()
    client = p._client
    assert client._url == "https://api.fireworks.ai/inference/v1/completions"
    assert client._headers == {
        "content-type": "application/json",
        "user-agent": "me",
        "authorization": "Bearer sk-1",
        "x-session-affinity": "s1",
    }
    assert (client._limit, client._connect_s) == (8, 2.0)


BAD_CONFIG: list[tuple[dict[str, Any], str]] = [
    ({"base_url": None}, "providers.p.base_url"),
    ({"base_url": "ftp://x/v1"}, "providers.p.base_url"),
    ({"base_url": "http:///v1"}, "providers.p.base_url"),
    ({"base_url": "http://x/v1#top"}, "providers.p.base_url"),
    ({"base_url": "http://x/v1?a=b c"}, "providers.p.base_url"),
    ({"base_url": "http://u:p@x/v1"}, "providers.p.base_url"),
    ({"api_key": 5}, "providers.p.api_key"),
    ({"api_key": "sk 1"}, "providers.p.api_key"),
    ({"headers": ["a"]}, "providers.p.headers"),
    ({"headers": {"bad name": "v"}}, "providers.p.headers.bad name"),
    ({"headers": {"x-a": 1}}, "providers.p.headers.x-a"),
    ({"headers": {"x-a": "a\nb"}}, "providers.p.headers.x-a"),
    ({"headers": {"Content-Length": "3"}}, "providers.p.headers.Content-Length"),
    ({"api_key": "k", "headers": {"Authorization": "x"}}, "providers.p.headers.Authorization"),
    ({"max_connections": 0}, "providers.p.max_connections"),
    ({"max_connections": True}, "providers.p.max_connections"),
    ({"connect_timeout_s": "1"}, "providers.p.connect_timeout_s"),
    ({"connect_timeout_s": 0}, "providers.p.connect_timeout_s"),
    ({"model": "x"}, "providers.p.model"),
    ({"api_version": "2024-10-21"}, "providers.p.api_version"),  # Azure's only
    ({"deployments": {"m": "d"}}, "providers.p.deployments"),
]


@pytest.mark.parametrize(("block", "path"), BAD_CONFIG)
def test_bad_config_names_the_path(block: dict[str, Any], path: str) -> None:
    settings = {"type": "openai", "base_url": "http://x/v1", **block}
    with pytest.raises(ConfigError) as exc:
        OpenAICompatProvider.from_config("p", "openai", settings, "providers.p")
    assert exc.value.path == path


def test_unknown_type_tag() -> None:
    with pytest.raises(ConfigError) as exc:
        OpenAICompatProvider.from_config("p", "vllm", {"base_url": "http://x"}, "providers.p")
    assert exc.value.path == "providers.p.type"


def test_a_base_url_query_is_kept_on_every_call() -> None:
    p = OpenAICompatProvider.from_config(
        "v",
        "vllm-server",
        {"base_url": "https://x/v1/?tenant=a&b=%20c"},
        "providers.v",
    )
    query = "?tenant=a&b=%20c"
    urls = (
        p.prepare(request(), target()).state.url,
        p.prepare_chat(chat_request(), target()).state.url,
        p.prepare_embedding(embedding_request(), target()).state.url,
    )
    assert urls == (
        f"https://x/v1/completions{query}",
        f"https://x/v1/chat/completions{query}",
        f"https://x/v1/embeddings{query}",
    )
    guard = p._guard
    assert guard is not None
    assert (guard._models_url, guard._tokenize_url) == (
        f"https://x/v1/models{query}",
        f"https://x/tokenize{query}",
    )


def test_empty_api_key_sends_no_authorization() -> None:
    p = OpenAICompatProvider.from_config(
        "p", "vllm-server", {"base_url": "http://x/v1", "api_key": ""}, "providers.p"
    )
    assert "authorization" not in p._client._headers


# ---------------------------------------------------------------- Azure OpenAI

AZURE = "https://my-resource.openai.azure.com"


def azure(**block: Any) -> OpenAICompatProvider:
    settings = {"type": "azure-openai", "base_url": AZURE, "api_key": "az-key", **block}
    return OpenAICompatProvider.from_config("az", "azure-openai", settings, "providers.az")


def chat_request(**fields: Any) -> Any:
    messages = [{"role": "user", "content": "hi"}]
    return validate_chat({"model": "alias", "messages": messages, **fields}, RequestLimits())


def embedding_request() -> Any:
    return validate_embedding({"model": "alias", "input": "hi"})


def all_urls(p: OpenAICompatProvider, model: str) -> tuple[str, str, str]:
    t = Target("alias", p.name, model, 30.0)
    return (
        p.prepare(request(), t).state.url,
        p.prepare_chat(chat_request(), t).state.url,
        p.prepare_embedding(embedding_request(), t).state.url,
    )


def test_azure_deployments_with_the_api_version_and_the_api_key_header() -> None:
    p = azure(api_version="2024-10-21", deployments={"gpt-4o-mini": "my-gpt4o-mini"})
    version = "?api-version=2024-10-21"
    root = f"{AZURE}/openai/deployments/my-gpt4o-mini"
    assert all_urls(p, "gpt-4o-mini") == (
        f"{root}/completions{version}",
        f"{root}/chat/completions{version}",
        f"{root}/embeddings{version}",
    )
    headers = p._client._headers
    assert headers["api-key"] == "az-key" and "authorization" not in headers


def test_azure_keeps_the_base_url_query_beside_the_api_version() -> None:
    p = azure(
        base_url=AZURE + "/?tenant=a", api_version="2025-04-01-preview", deployments={"m": "d"}
    )
    completions, _, _ = all_urls(p, "m")
    assert completions == (
        f"{AZURE}/openai/deployments/d/completions?tenant=a&api-version=2025-04-01-preview"
    )


def test_azure_reads_an_unquoted_yaml_date_as_the_api_version() -> None:
    p = azure(api_version=date(2024, 10, 21), deployments={"m": "d"})
    assert all_urls(p, "m")[0].endswith("/openai/deployments/d/completions?api-version=2024-10-21")


def test_azure_v1_without_an_api_version() -> None:
    p = azure()
    assert all_urls(p, "my-deployment") == (
        f"{AZURE}/openai/v1/completions",
        f"{AZURE}/openai/v1/chat/completions",
        f"{AZURE}/openai/v1/embeddings",
    )
    body = orjson.loads(p.prepare(request(), Target("a", "az", "my-deployment", 5.0)).state.payload)
    assert body["model"] == "my-deployment"  # the v1 API takes the deployment as the model
    p = azure(base_url=AZURE + "?tenant=a")
    assert all_urls(p, "m")[1] == f"{AZURE}/openai/v1/chat/completions?tenant=a"


@pytest.mark.parametrize("endpoint", ["completions", "chat", "embeddings"])
def test_azure_a_model_without_a_deployment_is_a_400_naming_it(endpoint: str) -> None:
    p = azure(api_version="2024-10-21", deployments={"gpt-4o-mini": "d"})
    t = Target("alias", "az", "gpt-4o", 30.0)
    with pytest.raises(InvalidRequest) as exc:
        if endpoint == "completions":
            p.prepare(request(), t)
        elif endpoint == "chat":
            p.prepare_chat(chat_request(), t)
        else:
            p.prepare_embedding(embedding_request(), t)
    err = exc.value
    assert (err.status, err.param) == (400, "model")
    assert "'gpt-4o'" in err.message and "providers.az.deployments" in err.message


def test_azure_keeps_the_content_filter_results() -> None:
    spec = DIALECTS["azure-openai"]
    assert spec.azure_addressing and spec.answer_extras == ("prompt_filter_results",)
    p = azure()
    shape = p.prepare(request(), target()).state.shape
    assert "content_filter_results" in shape.extras and "stop_reason" in shape.extras
    assert shape.upstream_extras == ("prompt_filter_results",)
    chat_shape = p.prepare_chat(chat_request(), target()).state.shape
    assert "content_filter_results" in chat_shape.choice_extras
    assert chat_shape.upstream_extras == ("prompt_filter_results",)
    # nothing of it for the others
    plain = provider("openai").prepare(request(), target()).state.shape
    assert plain.extras == ("stop_reason",) and plain.upstream_extras == ()


def test_azure_refuses_web_search_by_name() -> None:
    with pytest.raises(UnsupportedParameter) as exc:
        azure().prepare_chat(chat_request(web_search_options={}), target())
    assert exc.value.param == "web_search_options"
    assert "Azure" in exc.value.message


AZURE_BAD_CONFIG: list[tuple[dict[str, Any], str, str]] = [
    ({"api_version": "v1"}, "providers.az.api_version", "api-version"),
    ({"api_version": 2024}, "providers.az.api_version", "api-version"),
    ({"api_version": "2024-10-21"}, "providers.az.deployments", "required"),
    ({"api_version": "2024-10-21", "deployments": {}}, "providers.az.deployments", "required"),
    ({"api_version": "2024-10-21", "deployments": ["d"]}, "providers.az.deployments", "required"),
    (
        {"api_version": "2024-10-21", "deployments": {"m": "a/b"}},
        "providers.az.deployments.m",
        "deployment",
    ),
    ({"api_version": "2024-10-21", "deployments": {"m": 3}}, "providers.az.deployments.m", "name"),
    ({"deployments": {"m": "d"}}, "providers.az.deployments", "only with api_version"),
    ({"base_url": AZURE + "/openai/v1"}, "providers.az.base_url", "resource's endpoint"),
    ({"base_url": AZURE + "/openai/"}, "providers.az.base_url", "resource's endpoint"),
    (
        {"base_url": AZURE + "?api-version=1", "api_version": "2024-10-21", "deployments": {}},
        "providers.az.base_url",
        "api_version",
    ),
    ({"headers": {"Api-Key": "other"}}, "providers.az.headers.Api-Key", "conflicts"),
    ({"context_window": 5}, "providers.az.context_window", "unknown key"),
]


@pytest.mark.parametrize(("block", "path", "words"), AZURE_BAD_CONFIG)
def test_azure_bad_config_names_the_path(block: dict[str, Any], path: str, words: str) -> None:
    with pytest.raises(ConfigError) as exc:
        azure(**block)
    assert exc.value.path == path
    assert words in exc.value.message


def test_azure_may_carry_an_entra_token_instead_of_a_key() -> None:
    p = azure(api_key=None, headers={"Authorization": "Bearer entra-token"})
    assert p._client._headers["authorization"] == "Bearer entra-token"
    assert "api-key" not in p._client._headers
