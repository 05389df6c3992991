"""gateway.pipeline.endpoints: the table of inference endpoints agrees with the lists that core
keeps apart from it (core sits below the gateway and cannot read the table)."""

from __future__ import annotations

from core import batches, openapi
from gateway.api.app import EXACT
from gateway.pipeline.endpoints import ENDPOINTS
from gateway.routing.plans import SERVED


def test_each_row_is_served_documented_batchable_and_routed() -> None:
    assert [e.doc for e in ENDPOINTS] == list(openapi.INFERENCE)
    assert [e.batch_url for e in ENDPOINTS] == list(batches.ENDPOINTS)
    routed = {name for names in SERVED.values() for name in names}
    for endpoint in ENDPOINTS:
        assert endpoint.doc.path == endpoint.batch_url == endpoint.paths[0]
        assert endpoint.paths[1:] == (endpoint.doc.path.removeprefix("/v1"),)
        assert all(EXACT[path][0] is endpoint for path in endpoint.paths)
        assert endpoint.name in routed
        assert (endpoint.streaming is None) == (endpoint.doc.chunk is None)
    assert (
        len({e.name for e in ENDPOINTS}) == len({e.operation for e in ENDPOINTS}) == len(ENDPOINTS)
    )
