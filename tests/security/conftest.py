"""The fixture the probe modules that run on a scripted upstream share."""

from __future__ import annotations

import pytest

from tests.upstreams.procs import ScriptedUpstream


@pytest.fixture
def up(upstream: ScriptedUpstream) -> ScriptedUpstream:
    """The module's scripted upstream (its `upstream` fixture), its requests' record emptied."""
    upstream.reset()
    return upstream
