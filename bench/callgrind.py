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
    .venv/bin/python bench/callgrind.py --requests 500            # one run, no callgrind
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import orjson

HOST = "127.0.0.1"
KEY = "sk-bench-key"
ANSWER = orjson.dumps(
    {
        "id": "cmpl-1",
        "object": "text_completion",
        "created": 1,
        "model": "mock-model",
        "choices": [{"index": 0, "text": " This is a test.", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    }
)
UPSTREAM_ANSWER = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    % (len(ANSWER), ANSWER)
)
BODY = orjson.dumps({"model": "bench-model", "prompt": "Say this is a test", "max_tokens": 16})
REQUEST = (
    b"POST /v1/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer %s\r\n"
    b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
    % (KEY.encode(), len(BODY), BODY)
)
COUNTS = (200, 1200)  # the two runs' requests
COLLECTED = re.compile(r"Collected : (\d+)")


class Upstream(asyncio.Protocol):
    """Answers each request (a head, a body of its content-length) with the fixed answer."""

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
            self.transport.write(UPSTREAM_ANSWER)  # type: ignore[attr-defined]


def config(port: int) -> str:
    return (
        f"auth: {{keys: [{{id: b, key: {KEY}}}]}}\n"
        f"providers: {{up: {{type: openai-compatible, base_url: 'http://{HOST}:{port}/v1'}}}}\n"
        "models: {bench-model: {targets: [{provider: up, model: mock-model}]}}\n"
    )


async def run(requests: int) -> None:
    import uvicorn

    from gateway.config import parse

    try:
        from gateway.api.app import create_app
        from gateway.server.protocol import GatewayHttpProtocol
    except ImportError:  # a tree from before the modules moved (issue 34), for --compare
        from gateway.app import create_app  # type: ignore[no-redef]
        from gateway.protocol import GatewayHttpProtocol  # type: ignore[no-redef]

    loop = asyncio.get_running_loop()
    upstream = await loop.create_server(Upstream, HOST, 0)
    up_port = upstream.sockets[0].getsockname()[1]
    sock = socket.create_server((HOST, 0))
    app = create_app(parse(config(up_port)))
    uv = uvicorn.Config(app, http=GatewayHttpProtocol, lifespan="on", log_level="error")
    server = uvicorn.Server(uv)
    serving = asyncio.ensure_future(server.serve(sockets=[sock]))
    while not server.started:  # noqa: ASYNC110 - uvicorn's Server has no event to wait on
        await asyncio.sleep(0.01)
    reader, writer = await asyncio.open_connection(*sock.getsockname()[:2])
    for _ in range(requests):
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head)[1])  # type: ignore[index]
        body = await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head + body
    writer.close()
    server.should_exit = True
    await serving
    upstream.close()


def counted(tree: Path, requests: int) -> int:
    """Instructions of a run of `requests` on the gateway of `tree`, under callgrind."""
    cmd = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, str(Path(__file__).resolve()), "--requests", str(requests),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, check=True)
    return int(COLLECTED.findall(done.stderr)[-1])


def per_request(tree: Path) -> float:
    low, high = (counted(tree, n) for n in COUNTS)
    return (high - low) / (COUNTS[1] - COUNTS[0])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--requests", type=int, help="one run of this many, no callgrind")
    parser.add_argument("--compare", type=Path, help="another tree: its count beside this one's")
    args = parser.parse_args()
    if args.requests is not None:
        import uvloop

        uvloop.run(run(args.requests))
        return 0
    here = Path(__file__).resolve().parent.parent
    trees = {"this tree": here} | ({"compared": args.compare} if args.compare else {})
    counts = {name: per_request(tree) for name, tree in trees.items()}
    for name, count in counts.items():
        print(f"{name}: {count:,.0f} instructions a request")
    if args.compare:
        print(f"this tree / compared: {counts['this tree'] / counts['compared']:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
