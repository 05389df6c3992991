"""Instructions a request costs on the gateway's hot path, counted by callgrind: a figure that
does not move with the machine's load, for changes too small for wrk to see on a shared
machine (a few percent).

One process, one event loop (uvloop): a minimal upstream answering a fixed completion, the
gateway (the app of `gateway serve`, on the gateway's HTTP protocol under uvicorn) in front of
it, and a client sending N completions one after the other on one keep-alive connection. Run
under callgrind twice, with two counts of requests, the difference divided by the difference of
the counts is what one request costs (client, gateway and upstream: the client and upstream are
the same for any revision of the gateway, so the difference between two revisions is theirs).

    .venv/bin/python bench/callgrind.py --compare /tmp/before     # this tree against a worktree
    .venv/bin/python bench/callgrind.py --endpoint embeddings     # completions, chat, embeddings,
                                                                  # responses(-translated)
    .venv/bin/python bench/callgrind.py --requests 500            # one run, no callgrind
    .venv/bin/python bench/callgrind.py --extra 'request_log: {path: /dev/null}'  # a config's cost

Beside the trees, the same client and upstream without a gateway between them (`--direct`): the
floor, taken from each count to give the gateway's own instructions a request.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import orjson

HOST = "127.0.0.1"
KEY = "sk-bench-key"


def _exchange(path: str, body: object, answer: object) -> tuple[bytes, bytes]:
    """The client's request and the upstream's answer for one endpoint."""
    raw_body, raw_answer = orjson.dumps(body), orjson.dumps(answer)
    request = (
        b"POST %s HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
        b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (path.encode(), KEY.encode(), len(raw_body), raw_body)
    )
    upstream = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
        % (
            len(raw_answer),
            raw_answer,
        )
    )
    return request, upstream


USAGE = {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10}
CHAT_ANSWER = {
    "id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "mock-model",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "A test."},
                 "finish_reason": "stop"}],
    "usage": USAGE,
}  # fmt: skip
RESPONSES_REQUEST = {
    "model": "bench-model", "input": "Say this is a test", "max_output_tokens": 16, "store": False,
}  # fmt: skip
# A response object as OpenAI answers it (the request's fields echoed with OpenAI's defaults).
RESPONSE_ANSWER = {
    "id": "resp_" + "0" * 48, "object": "response", "created_at": 1, "status": "completed",
    "background": False, "completed_at": 1, "error": None, "incomplete_details": None,
    "instructions": None, "max_output_tokens": 16, "max_tool_calls": None, "model": "mock-model",
    "output": [{"id": "msg_" + "0" * 48, "type": "message", "status": "completed",
                "role": "assistant", "content": [{"type": "output_text", "annotations": [],
                                                  "logprobs": [], "text": "A test."}]}],
    "parallel_tool_calls": True, "previous_response_id": None, "prompt_cache_key": None,
    "reasoning": {"effort": None, "summary": None}, "safety_identifier": None,
    "service_tier": "default", "store": False, "temperature": 1.0,
    "text": {"format": {"type": "text"}, "verbosity": "medium"}, "tool_choice": "auto",
    "tools": [], "top_logprobs": 0, "top_p": 1.0, "truncation": "disabled",
    "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 5,
              "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 10},
    "user": None, "metadata": {},
}  # fmt: skip
COMPATIBLE, OPENAI = "openai-compatible", "openai"
# Per endpoint: the client's request and the upstream's answer, the alias's kind, and its
# provider's type (the Responses API: `openai` passes it through, `openai-compatible` makes it
# a chat completion).
EXCHANGES = {
    "completions": (
        _exchange(
            "/v1/completions",
            {"model": "bench-model", "prompt": "Say this is a test", "max_tokens": 16},
            {
                "id": "cmpl-1", "object": "text_completion", "created": 1, "model": "mock-model",
                "choices": [{"index": 0, "text": " This is a test.", "finish_reason": "length"}],
                "usage": USAGE,
            },
        ),
        "completions",
        COMPATIBLE,
    ),
    "chat": (
        _exchange(
            "/v1/chat/completions",
            {"model": "bench-model", "max_tokens": 16,
             "messages": [{"role": "user", "content": "Say this is a test"}]},
            CHAT_ANSWER,
        ),
        "completions",
        COMPATIBLE,
    ),
    "responses": (_exchange("/v1/responses", RESPONSES_REQUEST, RESPONSE_ANSWER), "completions",
                  OPENAI),
    "responses-translated": (_exchange("/v1/responses", RESPONSES_REQUEST, CHAT_ANSWER),
                             "completions", COMPATIBLE),
    "embeddings": (
        _exchange(
            "/v1/embeddings",
            {"model": "bench-model", "input": ["Say this is a test"] * 4},
            {
                "object": "list", "model": "mock-model",
                "data": [{"object": "embedding", "index": i, "embedding": [0.125] * 256}
                         for i in range(4)],
                "usage": {"prompt_tokens": 20, "total_tokens": 20},
            },
        ),
        "embeddings",
        COMPATIBLE,
    ),
}  # fmt: skip
COUNTS = (200, 1200)  # the two runs' requests
EXTRA_ENV = "GATEWAY_CALLGRIND_EXTRA"  # --extra, for the runs under callgrind
# Callgrind runs a request ~50 times as slowly as it runs, so a timer of the gateway's would fire
# ~50 times as often per request: the request log writer's 50 ms batching (LogFile.FLUSH_S),
# whose hand-over to its thread a request would then pay ~50 times too much of. Under callgrind
# that timer is this many times as long, so that a batch holds as many lines as in real time.
SLOWDOWN = 50
SLOWED_ENV = "GATEWAY_CALLGRIND_SLOWED"
COLLECTED = re.compile(r"Collected : (\d+)")


class Upstream(asyncio.Protocol):
    """Answers each request (a head, a body of its content-length) with the fixed answer."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.buffer = b""

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.transport.write(self.answer)  # type: ignore[attr-defined]


def config(port: int, kind: str, provider: str = COMPATIBLE) -> str:
    """The bench's config, and the YAML of --extra (in EXTRA_ENV) after it."""
    return (
        f"auth: {{keys: [{{id: b, key: {KEY}}}]}}\n"
        f"providers: {{up: {{type: {provider}, base_url: 'http://{HOST}:{port}/v1'}}}}\n"
        f"models: {{bench-model: {{endpoint: {kind}, "
        "targets: [{provider: up, model: mock-model}]}}\n"
    ) + os.environ.get(EXTRA_ENV, "")


async def run(requests: int, endpoint: str, direct: bool) -> None:
    import uvicorn

    from gateway.config import parse

    try:
        from gateway.api.app import create_app
        from gateway.server.protocol import GatewayHttpProtocol
    except ImportError:  # a tree from before the modules moved (issue 34), for --compare
        from gateway.app import create_app  # type: ignore[no-redef]
        from gateway.protocol import GatewayHttpProtocol  # type: ignore[no-redef]

    if os.environ.get(SLOWED_ENV):
        with contextlib.suppress(ImportError):  # a tree from before the request log
            from gateway.observability import logfile

            logfile.FLUSH_S *= SLOWDOWN
    loop = asyncio.get_running_loop()
    (request, answer), kind, provider = EXCHANGES[endpoint]
    upstream = await loop.create_server(lambda: Upstream(answer), HOST, 0)
    up_port = upstream.sockets[0].getsockname()[1]
    sock = socket.create_server((HOST, 0))
    app = create_app(parse(config(up_port, kind, provider)))
    uv = uvicorn.Config(app, http=GatewayHttpProtocol, lifespan="on", log_level="error")
    server = uvicorn.Server(uv)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn's Server has no event to wait on
        await asyncio.sleep(0.01)
    # --direct: the client calls the upstream itself (the floor: what is not the gateway's).
    address = (HOST, up_port) if direct else sock.getsockname()[:2]
    reader, writer = await asyncio.open_connection(*address)
    for _ in range(requests):
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        body = await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head + body
    writer.close()
    server.should_exit = True
    await serving
    upstream.close()


def counted(tree: Path, requests: int, endpoint: str, direct: bool) -> int:
    """Instructions of a run of `requests` on the gateway of `tree`, under callgrind."""
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, str(Path(__file__).resolve()), "--requests", str(requests),
        "--endpoint", endpoint, *(["--direct"] if direct else []),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree), SLOWED_ENV: "1"}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return int(COLLECTED.findall(done.stderr)[-1])


def per_request(tree: Path, endpoint: str, direct: bool = False) -> float:
    low, high = (counted(tree, n, endpoint, direct) for n in COUNTS)
    return (high - low) / (COUNTS[1] - COUNTS[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, help="one run of this many, no callgrind")
    parser.add_argument("--compare", type=Path, help="another tree: its count beside this one's")
    parser.add_argument("--endpoint", choices=tuple(EXCHANGES), default="completions")
    parser.add_argument("--direct", action="store_true", help="the client calls the upstream")
    parser.add_argument(
        "--extra", default="", help="YAML added to the config (e.g. request_log, telemetry)"
    )
    args = parser.parse_args()
    os.environ[EXTRA_ENV] = os.environ.get(EXTRA_ENV) or args.extra
    if args.requests is not None:
        import uvloop

        uvloop.run(run(args.requests, args.endpoint, args.direct))
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"this tree": here} | ({"compared": args.compare} if args.compare else {})
    counts = {name: per_request(tree, args.endpoint) for name, tree in trees.items()}
    floor = per_request(here, args.endpoint, direct=True)
    print(f"{args.endpoint}; the floor (client and upstream alone): {floor:,.0f} instructions")
    for name, count in counts.items():
        print(f"{name}: {count:,.0f} instructions a request, the gateway's {count - floor:,.0f}")
    if args.compare:
        ours, theirs = (counts[name] - floor for name in trees)
        print(
            f"this tree / compared: {counts['this tree'] / counts['compared']:.4f} in all, "
            f"{ours / theirs:.4f} of the gateway's own"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
