"""gateway.jobs.batches: a batch object as the API shows it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from core.batches import MAX_ERRORS_SHOWN
from gateway import config
from gateway.jobs.batches import shown
from gateway.jobs.batchstore import BatchStore
from gateway.runtime import Runtime
from tests.unit.core.test_batches import BATCH_ID


@pytest.mark.asyncio
async def test_a_batch_stored_with_all_its_errors_is_shown_with_the_first(tmp_path: Path) -> None:
    """A record written before the errors were bounded: its object is bounded when shown."""
    store = BatchStore(
        Runtime.build(config.parse(f"auth: {{keys: []}}\nfiles: {{store: {tmp_path}}}\n")).files
    )
    error = {"code": "invalid_json_line", "message": "m", "param": None, "line": 1}
    batch: Any = {
        "id": BATCH_ID,
        "status": "failed",
        "errors": {"object": "list", "data": [error] * (MAX_ERRORS_SHOWN * 2)},
    }
    seen = await shown(store, {"batch": batch, "key_id": "k", "owner": "o"})
    assert seen["errors"] is not None
    assert len(seen["errors"]["data"]) == MAX_ERRORS_SHOWN
    assert seen["errors"]["total"] == MAX_ERRORS_SHOWN * 2
