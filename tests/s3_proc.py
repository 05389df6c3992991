"""A real S3-compatible server for tests: moto in server mode, on a free port, with one bucket.

with S3Server() as s3:
    s3.url("prefix")      # s3://<bucket>/prefix, for `files.store`
    s3.env                # what obstore reads to reach it (endpoint, plain HTTP, credentials)
    s3.keys()             # every object's key in the bucket
"""

from __future__ import annotations

import sys
from xml.etree import ElementTree

import httpx

from tests.upstreams.procs import ServerProcess, StopOnExit, start_on_free_port

BUCKET = "gateway-files"
S3_NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


class S3Server(StopOnExit):
    def __init__(self) -> None:
        self._server: ServerProcess = start_on_free_port(
            lambda port: [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            ready_path="/moto-api/",
        )
        self.endpoint: str = self._server.root
        # moto does not check signatures: any credentials do, but obstore needs some.
        self.env = {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_REGION": "us-east-1",
        }
        httpx.put(f"{self.endpoint}/{BUCKET}").raise_for_status()

    def url(self, prefix: str) -> str:
        return f"s3://{BUCKET}/{prefix}"

    def keys(self) -> list[str]:
        listing = httpx.get(f"{self.endpoint}/{BUCKET}?list-type=2&max-keys=100000")
        listing.raise_for_status()
        root = ElementTree.fromstring(listing.content)
        return [k.text or "" for k in root.iter(f"{S3_NS}Key")]

    def stop(self) -> int | None:
        return self._server.stop()
