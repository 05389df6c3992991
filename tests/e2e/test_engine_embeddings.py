"""Embeddings from a real pooling model, with the openai SDK: the in-process engine running the
tiny model on vLLM's pooling runner, and vLLM's own server in pooling mode, both behind one
gateway and the server also called directly (parity).

    provider `pool`     type: vllm, runner pooling (LAST token, normalized), Matryoshka
                        dimensions [32, 64, 128] declared through hf_overrides
    provider `server`   type: vllm-server → vLLM's server on the same model (not Matryoshka)

    embed          endpoint embeddings → pool
    embed-server   endpoint embeddings → server
    embed-text     a completions alias on the pooling engine (refused: it cannot generate)

One engine and one vLLM server for the module. The SDK asks for base64 by default and decodes it;
the tests also ask for floats where the raw numbers matter.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import orjson
import pytest

from tests.e2e.batches import finished, lines_of, until
from tests.e2e.metrics_text import scrape
from tests.gateway_proc import GatewayProcess
from tests.vllm_proc import MODEL_DIR, VLLM_ENV, VllmServer, require_vllm

require_vllm()

KEY = "sk-embed"
METERED_KEY = "sk-embed-metered"
METERED_TPM = 40
WINDOW = 512
DIMENSIONS = 128  # the tiny model's hidden size
MATRYOSHKA = (32, 64, 128)
TEXTS = ["hello world", "abc", "Once upon a time there was a gateway"]
HELLO_TOKENS = 7  # "hello world" with BOS, by the tiny tokenizer
ENGINE_READY_TIMEOUT_S = 300.0
POOLING = ("--runner", "pooling", "--convert", "embed", "--kv-cache-memory-bytes", "67108864")
CONFIG = """\
auth:
  keys:
    - {{id: t, key: {key}, models: ["*"]}}
    - {{id: metered, key: {metered}, models: [embed], limits: {{tpm: {tpm}}}}}
providers:
  pool:
    type: vllm
    model: {model_dir}
    engine_args:
      runner: pooling
      convert: embed
      max_model_len: {window}
      dtype: float32
      enforce_eager: true
      kv_cache_memory_bytes: 67108864
      hf_overrides: {{matryoshka_dimensions: {matryoshka}}}
  server: {{type: vllm-server, base_url: "{url}"}}
models:
  embed: {{endpoint: embeddings, targets: [{{provider: pool}}]}}
  embed-server: {{endpoint: embeddings, targets: [{{provider: server, model: tiny}}]}}
  embed-text: {{targets: [{{provider: pool}}]}}
files: {{store: "{store}"}}
batches: {{poll_s: 0.05}}
"""


@dataclass(frozen=True)
class Pool:
    server: VllmServer
    gateway: GatewayProcess

    def client(self, key: str = KEY) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.gateway.url + "/v1", api_key=key, max_retries=0)

    def direct(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    workdir = tmp_path_factory.mktemp("gateway-pooling")
    with VllmServer(extra=POOLING) as server:
        text = CONFIG.format(
            key=KEY,
            metered=METERED_KEY,
            tpm=METERED_TPM,
            model_dir=MODEL_DIR,
            window=WINDOW,
            matryoshka=list(MATRYOSHKA),
            url=server.url,
            store=workdir / "files",
        )
        with GatewayProcess(text, workdir, env=VLLM_ENV, timeout=ENGINE_READY_TIMEOUT_S) as gw:
            yield Pool(server, gw)


@pytest.fixture(scope="module")
def client(pool: Pool) -> Iterator[openai.OpenAI]:
    with pool.client() as c:
        yield c


@pytest.fixture(scope="module")
def direct(pool: Pool) -> Iterator[openai.OpenAI]:
    with pool.direct() as c:
        yield c


def vectors(client: openai.OpenAI, model: str, input: Any, **kw: Any) -> list[list[float]]:
    resp = client.embeddings.create(model=model, input=input, **kw)
    return [item.embedding for item in resp.data]


def assert_close(got: Sequence[Sequence[float]], want: Sequence[Sequence[float]]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert len(g) == len(w)
        assert max(abs(a - b) for a, b in zip(g, w, strict=True)) < 1e-5


def norm(v: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def refusal(call: Any) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as exc:
        call()
    return exc.value


# ---------------------------------------------------------------- the answer


def test_engine_embeds_as_vllm_server_does(client: openai.OpenAI, direct: openai.OpenAI) -> None:
    resp = client.embeddings.create(model="embed", input=TEXTS)  # the SDK's default: base64
    want = direct.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    assert resp.object == "list" and resp.model == "embed"
    assert [(d.object, d.index) for d in resp.data] == [("embedding", i) for i in range(3)]
    assert_close([d.embedding for d in resp.data], [d.embedding for d in want.data])
    assert all(len(d.embedding) == DIMENSIONS for d in resp.data)
    assert all(abs(norm(d.embedding) - 1) < 1e-5 for d in resp.data)  # the pooler normalizes
    assert resp.usage.prompt_tokens == want.usage.prompt_tokens == resp.usage.total_tokens


@pytest.mark.parametrize("model", ["embed", "embed-server"])
@pytest.mark.parametrize(
    "input",
    [
        "hello world",
        ["hello world", "abc"],
        [1, 262, 336, 269],
        [[1, 262, 336], [1, 68, 69, 70]],
    ],
    ids=["string", "strings", "token-ids", "token-id-arrays"],
)
def test_every_input_form_matches_vllm_directly(
    client: openai.OpenAI, direct: openai.OpenAI, model: str, input: Any
) -> None:
    want = vectors(direct, "tiny", input, encoding_format="float")
    assert_close(vectors(client, model, input, encoding_format="float"), want)
    assert_close(vectors(client, model, input), want)  # the SDK's base64, decoded by it


def test_raw_base64_is_little_endian_float32(pool: Pool, direct: openai.OpenAI) -> None:
    body = {"model": "embed", "input": "hello world", "encoding_format": "base64"}
    resp = httpx.post(
        pool.gateway.url + "/v1/embeddings", json=body, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert resp.status_code == 200, resp.text
    raw = base64.b64decode(resp.json()["data"][0]["embedding"])
    got = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    assert_close([got], vectors(direct, "tiny", "hello world", encoding_format="float"))
    assert resp.json()["usage"] == {"prompt_tokens": HELLO_TOKENS, "total_tokens": HELLO_TOKENS}


def test_concurrent_requests_each_get_their_own_vectors(pool: Pool, client: openai.OpenAI) -> None:
    inputs = [f"request number {i} " * (i + 1) for i in range(8)]
    alone = [vectors(client, "embed", text)[0] for text in inputs]

    async def together() -> list[list[float]]:
        async with openai.AsyncOpenAI(
            base_url=pool.gateway.url + "/v1", api_key=KEY, max_retries=0
        ) as sdk:
            answers = await asyncio.gather(
                *(sdk.embeddings.create(model="embed", input=text) for text in inputs)
            )
        return [a.data[0].embedding for a in answers]

    assert_close(asyncio.run(together()), alone)


# ---------------------------------------------------------------- dimensions


def test_matryoshka_dimensions_cut_and_renormalize(client: openai.OpenAI) -> None:
    (full,) = vectors(client, "embed", "hello world", encoding_format="float")
    for size in MATRYOSHKA:
        (cut,) = vectors(client, "embed", "hello world", dimensions=size)
        head = full[:size]
        assert_close([cut], [[x / norm(head) for x in head]])


@pytest.mark.parametrize("size", [48, 129])
def test_dimensions_the_model_lacks_are_refused_naming_them(
    client: openai.OpenAI, size: int
) -> None:
    exc = refusal(lambda: vectors(client, "embed", "hi", dimensions=size))
    assert exc.param == "dimensions"
    assert str(size) in exc.message


def test_dimensions_on_a_model_without_matryoshka_are_refused(client: openai.OpenAI) -> None:
    exc = refusal(lambda: vectors(client, "embed-server", "hi", dimensions=64))
    assert "Matryoshka" in exc.message


# ---------------------------------------------------------------- vLLM's extras and refusals


@pytest.mark.parametrize(
    "extra",
    [{"truncate_prompt_tokens": 3}, {"truncate_prompt_tokens": -1}, {"add_special_tokens": False}],
    ids=["truncate-3", "truncate-window", "no-bos"],
)
def test_vllm_extras_match_vllm_directly(
    client: openai.OpenAI, direct: openai.OpenAI, extra: dict[str, Any]
) -> None:
    kw: dict[str, Any] = {"input": TEXTS, "encoding_format": "float", "extra_body": extra}
    got = client.embeddings.create(model="embed", **kw)
    want = direct.embeddings.create(model="tiny", **kw)
    assert_close([d.embedding for d in got.data], [d.embedding for d in want.data])
    assert got.usage.prompt_tokens == want.usage.prompt_tokens


def test_an_input_longer_than_the_window_is_refused(client: openai.OpenAI) -> None:
    exc = refusal(lambda: vectors(client, "embed", ["ok", "word " * WINDOW]))
    assert exc.param == "input" and exc.code == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in exc.message and "input 1" in exc.message


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"truncate_prompt_tokens": WINDOW + 1}, "truncate_prompt_tokens"),
        ({"truncate_prompt_tokens": -2}, "truncate_prompt_tokens"),
        ({"use_activation": "yes"}, "use_activation"),
        ({"embed_dtype": "float16"}, "embed_dtype"),  # a vLLM field the engine does not serve
    ],
)
def test_bad_extras_are_refused_naming_them(
    client: openai.OpenAI, extra: dict[str, Any], param: str
) -> None:
    exc = refusal(lambda: vectors(client, "embed", "hi", extra_body=extra))
    assert exc.param == param


def test_token_ids_outside_the_vocabulary_are_refused(client: openai.OpenAI) -> None:
    exc = refusal(lambda: vectors(client, "embed", [1, 5, 100000]))
    assert exc.param == "input"


def test_a_completion_alias_on_the_pooling_engine_is_refused(client: openai.OpenAI) -> None:
    exc = refusal(lambda: client.completions.create(model="embed-text", prompt="hi"))
    assert exc.param == "model"
    assert "/v1/embeddings" in exc.message


# ---------------------------------------------------------------- limits and metrics


def test_tpm_counts_inputs_with_the_engine_tokenizer(pool: Pool) -> None:
    # 7 tokens a call by the engine's tokenizer: the 6th call would pass 40 (an estimate from
    # the text's 11 bytes would allow 13 calls).
    with pool.client(METERED_KEY) as metered:
        for _ in range(40 // HELLO_TOKENS):
            vectors(metered, "embed", "hello world")
        with pytest.raises(openai.RateLimitError):
            vectors(metered, "embed", "hello world")


def test_metrics_count_embeddings_by_operation(pool: Pool, client: openai.OpenAI) -> None:
    labels = {"model": "embed", "provider": "pool", "operation": "embeddings", "status": "200"}
    before = scrape(pool.gateway.url)
    vectors(client, "embed", TEXTS)
    after = scrape(pool.gateway.url)
    assert after.delta(before, "gateway_requests_total", **labels) == 1


# ---------------------------------------------------------------- batches


def test_an_embeddings_batch_on_the_engine(client: openai.OpenAI) -> None:
    """Each line embedded by the engine as the same request sent live is."""
    lines = [
        {
            "custom_id": f"e{i}",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": "embed", "input": text, "encoding_format": "float"},
        }
        for i, text in enumerate(TEXTS)
    ]
    content = b"\n".join(orjson.dumps(line) for line in lines)
    made = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    batch = client.batches.create(
        input_file_id=made.id, endpoint="/v1/embeddings", completion_window="24h"
    )
    done = until(client, batch.id, finished)
    assert done.status == "completed" and done.error_file_id is None
    out = {x["custom_id"]: x["response"]["body"] for x in lines_of(client, done.output_file_id)}
    for i, text in enumerate(TEXTS):
        assert out[f"e{i}"]["model"] == "embed"
        got = [item["embedding"] for item in out[f"e{i}"]["data"]]
        assert_close(got, vectors(client, "embed", text, encoding_format="float"))
