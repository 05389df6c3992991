"""Azure OpenAI as a provider, through the real openai SDK: a gateway in front of the scripted
Azure upstream (tests/upstreams/dialect_azure.py), which answers only at Azure's addresses with
Azure's key header. With an api_version, each model goes to its deployment; without one, to
Azure's v1 API. The content filter's refusal keeps its code, its verdicts reach the caller, and
a query string on any provider's base_url is kept on every call."""

from __future__ import annotations

from base64 import b64decode
from collections.abc import Iterator
from typing import Any, Literal

import httpx
import openai
import pytest
import yaml

from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.upstreams.chat_fake import chat_prompt
from tests.upstreams.fakegen import expected_text
from tests.upstreams.procs import AZURE_TEST_KEY, OPENAI_TEST_KEY, ScriptedUpstream

KEY = "k-azure-e2e"
WRONG_KEY = "az-wrong-key-0123456789"
DEPLOYMENT = "my-gpt4o-mini"
EMBED_DEPLOYMENT = "my-embedder"
V1_DEPLOYMENT = "my-v1-deployment"
VERSION = "2024-10-21"
TENANT = "tenant=a"
MESSAGES: Any = [{"role": "user", "content": "Say this is a test"}]
PROMPT = "Say this is a test"


def config(azure_root: str, openai_url: str) -> str:
    deployed = {"api_version": VERSION, "api_key": AZURE_TEST_KEY}
    providers = {
        "az": {
            "type": "azure-openai",
            "base_url": f"{azure_root}/?{TENANT}",
            **deployed,
            "deployments": {"gpt-4o-mini": DEPLOYMENT, "text-embedding-3-small": EMBED_DEPLOYMENT},
        },
        "az-v1": {"type": "azure-openai", "base_url": azure_root, "api_key": AZURE_TEST_KEY},
        "az-wrong": {
            "type": "azure-openai",
            "base_url": azure_root,
            "api_key": WRONG_KEY,
            "api_version": VERSION,
            "deployments": {"gpt-4o-mini": DEPLOYMENT},
        },
        "tenant": {
            "type": "openai-compatible",
            "base_url": f"{openai_url}?tenant=b&x=%2F",
            "api_key": OPENAI_TEST_KEY,
        },
    }

    def alias(provider: str, model: str, **more: Any) -> dict[str, Any]:
        return {"targets": [{"provider": provider, "model": model}], **more}

    embeddings = {"endpoint": "embeddings"}
    models = {
        "azure": alias("az", "gpt-4o-mini"),
        "azure-embed": alias("az", "text-embedding-3-small", **embeddings),
        "azure-undeployed": alias("az", "gpt-4o"),
        "azure-undeployed-embed": alias("az", "gpt-4o", **embeddings),
        "azure-v1": alias("az-v1", V1_DEPLOYMENT),
        "azure-v1-embed": alias("az-v1", EMBED_DEPLOYMENT, **embeddings),
        "azure-wrong-key": alias("az-wrong", "gpt-4o-mini"),
        "tenant": alias("tenant", "gpt-3.5-turbo-instruct"),
        "tenant-embed": alias("tenant", "text-embedding-3-small", **embeddings),
    }
    text: str = yaml.safe_dump(
        {
            "auth": {"keys": [{"id": "team", "key": KEY}]},
            "providers": providers,
            "models": models,
            "circuit_breaker": {"failures": 0},
        },
        sort_keys=False,
    )
    return text


@pytest.fixture(scope="module")
def gateway(
    scripted_azure_server: ScriptedUpstream,
    scripted_openai_server: ScriptedUpstream,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[GatewayProcess]:
    text = config(scripted_azure_server.root, scripted_openai_server.url)
    with GatewayProcess(text, tmp_path_factory.mktemp("azure")) as gw:
        yield gw


@pytest.fixture
def sdk(gateway: GatewayProcess) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=gateway.url + "/v1", api_key=KEY, max_retries=0) as client:
        yield client


def extra(obj: Any, name: str) -> Any:
    """A field the SDK's models do not declare (Azure's), as the gateway sent it."""
    extras = obj.model_extra or {}
    return extras.get(name)


def assert_azure_call(sent: dict[str, Any], path: str, query: str) -> None:
    """What the upstream saw: Azure's address, the key in `api-key`, no Authorization."""
    assert sent["path"] == path
    assert sent["query"] == query
    assert sent["headers"]["api-key"] == AZURE_TEST_KEY
    assert "authorization" not in sent["headers"]
    assert KEY not in str(sent["headers"])


DEPLOYED_QUERY = f"{TENANT}&api-version={VERSION}"


# ---------------------------------------------------------------- deployments


def test_completions_go_to_the_deployment(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream
) -> None:
    resp = sdk.completions.create(model="azure", prompt=PROMPT, max_tokens=5)
    choice = resp.choices[0]
    assert (choice.text, choice.finish_reason) == (expected_text(PROMPT, 0, 5), "length")
    assert resp.model == "azure"
    verdicts = extra(choice, "content_filter_results")
    assert verdicts["hate"] == {"filtered": False, "severity": "safe"}
    (sent,) = scripted_azure.requests()
    assert_azure_call(sent, f"/openai/deployments/{DEPLOYMENT}/completions", DEPLOYED_QUERY)
    assert sent["body"]["prompt"] == PROMPT


def test_a_completions_stream(sdk: openai.OpenAI, scripted_azure: ScriptedUpstream) -> None:
    chunks = list(
        sdk.completions.create(
            model="azure",
            prompt=PROMPT,
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == expected_text(PROMPT, 0, 5)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    worded = [c.choices[0] for c in chunks if c.choices and c.choices[0].text]
    assert all(extra(c, "content_filter_results")["hate"]["filtered"] is False for c in worded)
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 5
    (sent,) = scripted_azure.requests()
    assert_azure_call(sent, f"/openai/deployments/{DEPLOYMENT}/completions", DEPLOYED_QUERY)
    assert sent["body"]["stream_options"] == {"include_usage": True}


def test_chat(sdk: openai.OpenAI, scripted_azure: ScriptedUpstream) -> None:
    resp = sdk.chat.completions.create(model="azure", messages=MESSAGES, max_tokens=5)
    choice = resp.choices[0]
    assert choice.message.content == expected_text(chat_prompt(MESSAGES), 0, 5)
    assert choice.finish_reason == "length"
    assert extra(choice, "content_filter_results")["violence"]["filtered"] is False
    (sent,) = scripted_azure.requests()
    assert_azure_call(sent, f"/openai/deployments/{DEPLOYMENT}/chat/completions", DEPLOYED_QUERY)


def test_a_chat_stream(sdk: openai.OpenAI, scripted_azure: ScriptedUpstream) -> None:
    stream = sdk.chat.completions.create(
        model="azure",
        messages=MESSAGES,
        max_tokens=5,
        stream=True,
    )
    chunks = list(stream)
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == expected_text(chat_prompt(MESSAGES), 0, 5)
    assert chunks[-1].choices[0].finish_reason == "length"
    worded = [c.choices[0] for c in chunks if c.choices and c.choices[0].delta.content]
    assert worded and all(extra(c, "content_filter_results") for c in worded)
    (sent,) = scripted_azure.requests()
    assert_azure_call(sent, f"/openai/deployments/{DEPLOYMENT}/chat/completions", DEPLOYED_QUERY)


@pytest.mark.parametrize("encoding", ["float", "base64"])
def test_embeddings(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream, encoding: Literal["float", "base64"]
) -> None:
    resp = sdk.embeddings.create(
        model="azure-embed",
        input=["one", "two words"],
        encoding_format=encoding,
    )
    vectors: list[Any] = [d.embedding for d in resp.data]  # base64: the string as sent
    sizes = [len(v) if encoding == "float" else len(b64decode(v)) // 4 for v in vectors]
    assert sizes == [16, 16]  # float32s, when asked for as base64
    assert resp.usage.prompt_tokens == 3
    (sent,) = scripted_azure.requests()
    path = f"/openai/deployments/{EMBED_DEPLOYMENT}/embeddings"
    assert_azure_call(sent, path, DEPLOYED_QUERY)
    assert sent["body"].get("encoding_format", "float") == encoding  # Azure has OpenAI's base64


@pytest.mark.parametrize("alias", ["azure-undeployed", "azure-undeployed-embed"])
def test_a_model_without_a_deployment_is_a_400_and_no_call(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream, alias: str
) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        if alias.endswith("embed"):
            sdk.embeddings.create(model=alias, input="x")
        else:
            sdk.chat.completions.create(model=alias, messages=MESSAGES)
    err = exc.value
    assert err.status_code == 400 and err.param == "model"
    assert "'gpt-4o'" in err.message and "providers.az.deployments" in err.message
    assert scripted_azure.requests() == []


# ---------------------------------------------------------------- the v1 API


def test_the_v1_api_without_an_api_version(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream
) -> None:
    resp = sdk.completions.create(model="azure-v1", prompt=PROMPT, max_tokens=3)
    assert resp.choices[0].text == expected_text(PROMPT, 0, 3)
    chat = sdk.chat.completions.create(model="azure-v1", messages=MESSAGES, max_tokens=3)
    assert chat.choices[0].message.content == expected_text(chat_prompt(MESSAGES), 0, 3)
    stream = sdk.chat.completions.create(
        model="azure-v1",
        messages=MESSAGES,
        max_tokens=3,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == (
        expected_text(chat_prompt(MESSAGES), 0, 3)
    )
    sdk.embeddings.create(model="azure-v1-embed", input="x")
    sent = scripted_azure.requests()
    paths = ["completions", "chat/completions", "chat/completions", "embeddings"]
    for call, path in zip(sent, paths, strict=True):
        assert_azure_call(call, f"/openai/v1/{path}", "")
    assert [c["body"]["model"] for c in sent] == [V1_DEPLOYMENT] * 3 + [EMBED_DEPLOYMENT]


# ---------------------------------------------------------------- the content filter


@pytest.mark.parametrize("stream", [False, True])
def test_the_content_filter_s_refusal_keeps_its_code(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream, stream: bool
) -> None:
    messages: Any = [{"role": "user", "content": "something __content_filter__"}]
    with pytest.raises(openai.BadRequestError) as exc:  # before any byte of a stream, too
        sdk.chat.completions.create(model="azure", messages=messages, stream=stream)
    err = exc.value
    assert (err.status_code, err.code, err.param) == (400, "content_filter", "prompt")
    assert "content management policy" in err.message
    with pytest.raises(openai.BadRequestError) as exc:
        sdk.completions.create(model="azure", prompt="x __content_filter__", stream=stream)
    assert exc.value.code == "content_filter"
    # no retry, no fallback: the caller's prompt was refused
    assert len(scripted_azure.requests()) == 2


def test_filtered_output_ends_content_filter(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream
) -> None:
    messages: Any = [{"role": "user", "content": "tell me __filtered_output__"}]
    resp = sdk.chat.completions.create(model="azure", messages=messages, max_tokens=4)
    choice = resp.choices[0]
    assert choice.finish_reason == "content_filter"
    assert extra(choice, "content_filter_results")["hate"] == {"filtered": True, "severity": "high"}
    stream = sdk.chat.completions.create(
        model="azure",
        messages=messages,
        max_tokens=4,
        stream=True,
    )
    assert [c.choices[0].finish_reason for c in stream if c.choices][-1] == "content_filter"
    resp2 = sdk.completions.create(model="azure", prompt="x __filtered_output__", max_tokens=2)
    assert resp2.choices[0].finish_reason == "content_filter"


def test_the_prompt_s_verdicts_reach_the_caller(
    sdk: openai.OpenAI, scripted_azure: ScriptedUpstream
) -> None:
    resp = sdk.completions.create(model="azure", prompt=PROMPT, max_tokens=2)
    assert extra(resp, "prompt_filter_results")[0]["prompt_index"] == 0
    chat = sdk.chat.completions.create(model="azure", messages=MESSAGES, max_tokens=2)
    assert extra(chat, "prompt_filter_results")[0]["prompt_index"] == 0
    stream = sdk.chat.completions.create(
        model="azure",
        messages=MESSAGES,
        max_tokens=2,
        stream=True,
    )
    first = next(iter(stream))
    assert extra(first, "prompt_filter_results")[0]["prompt_index"] == 0


# ---------------------------------------------------------------- the key


def test_the_key_never_shows(gateway: GatewayProcess, sdk: openai.OpenAI) -> None:
    """A key Azure refuses: the caller gets the gateway's 502, which names neither key; the
    logs and the metrics do not either."""
    with pytest.raises(openai.APIStatusError) as exc:
        sdk.completions.create(model="azure-wrong-key", prompt=PROMPT, max_tokens=2)
    err = exc.value
    assert err.status_code == 502
    body = str(err.body)
    assert "upstream_authentication_failed" in body
    metrics = httpx.get(f"{gateway.url}/metrics", timeout=10.0, trust_env=False).text
    scrape(gateway.url)  # well formed
    for text in (body, err.message, gateway.logs(), metrics):
        assert WRONG_KEY not in text and AZURE_TEST_KEY not in text


# ---------------------------------------------------------------- base_url query strings


def test_a_base_url_query_is_kept_on_every_call(
    sdk: openai.OpenAI, scripted_openai: ScriptedUpstream
) -> None:
    """An openai-compatible provider's `base_url: …/v1?tenant=b&x=%2F`: every call keeps it."""
    sdk.completions.create(model="tenant", prompt=PROMPT, max_tokens=2)
    list(sdk.completions.create(model="tenant", prompt=PROMPT, max_tokens=2, stream=True))
    sdk.chat.completions.create(model="tenant", messages=MESSAGES, max_tokens=2)
    sdk.embeddings.create(model="tenant-embed", input="x")
    sent = scripted_openai.requests()
    assert [c["path"] for c in sent] == [
        "/v1/completions",
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/embeddings",
    ]
    assert {c["query"] for c in sent} == {"tenant=b&x=%2F"}
    assert {c["headers"]["authorization"] for c in sent} == {f"Bearer {OPENAI_TEST_KEY}"}
