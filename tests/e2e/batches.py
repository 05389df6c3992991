"""The Batch API's steps as tests take them with the openai SDK: a file of requests, a batch
started on it, waited on, and its output read."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import openai
import orjson
from openai.types import Batch

DEADLINE_S = 30.0


def requests(n: int, url: str = "/v1/completions", **body: Any) -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": url,
            "body": {"model": "oa", "prompt": f"Say {i}", "max_tokens": 3, **body},
        }
        for i in range(n)
    ]
    return b"\n".join(orjson.dumps(line) for line in lines) + b"\n"


def until(
    client: openai.OpenAI,
    batch_id: str,
    done: Callable[[Batch], bool],
    deadline_s: float = DEADLINE_S,
) -> Batch:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch.status}")


def completed(batch: Batch) -> int:
    return batch.request_counts.completed if batch.request_counts is not None else 0


def finished(batch: Batch) -> bool:
    return batch.status in ("completed", "failed", "cancelled", "expired")


def start(client: openai.OpenAI, content: bytes, endpoint: str = "/v1/completions") -> Batch:
    made = client.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    return client.batches.create(
        input_file_id=made.id,
        endpoint=endpoint,  # type: ignore[arg-type]
        completion_window="24h",
        metadata={"team": "evals"},
    )


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    assert file_id is not None
    return [orjson.loads(x) for x in client.files.content(file_id).read().splitlines()]
