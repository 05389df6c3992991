"""Pytest fixtures for the scripted upstreams; import those a conftest.py needs, in pairs:

    from tests.upstreams.fixtures import (  # noqa: F401  (pytest fixtures)
        scripted_fireworks, scripted_fireworks_server, scripted_openai, scripted_openai_server,
    )

Each is one server per test session, reset (log, stats, scripts) before every test that uses
it. Keys: OPENAI_TEST_KEY / FIREWORKS_TEST_KEY / AZURE_TEST_KEY from tests.upstreams.procs.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .procs import (
    AZURE_TEST_KEY,
    FIREWORKS_TEST_KEY,
    OPENAI_TEST_KEY,
    ScriptedUpstream,
    start_scripted,
)


@pytest.fixture(scope="session")
def scripted_openai_server() -> Iterator[ScriptedUpstream]:
    with start_scripted("openai", api_key=OPENAI_TEST_KEY) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def scripted_fireworks_server() -> Iterator[ScriptedUpstream]:
    with start_scripted("fireworks", api_key=FIREWORKS_TEST_KEY) as upstream:
        yield upstream


@pytest.fixture(scope="session")
def scripted_azure_server() -> Iterator[ScriptedUpstream]:
    with start_scripted("azure", api_key=AZURE_TEST_KEY) as upstream:
        yield upstream


@pytest.fixture
def scripted_openai(scripted_openai_server: ScriptedUpstream) -> ScriptedUpstream:
    scripted_openai_server.reset()
    return scripted_openai_server


@pytest.fixture
def scripted_fireworks(scripted_fireworks_server: ScriptedUpstream) -> ScriptedUpstream:
    scripted_fireworks_server.reset()
    return scripted_fireworks_server


@pytest.fixture
def scripted_azure(scripted_azure_server: ScriptedUpstream) -> ScriptedUpstream:
    scripted_azure_server.reset()
    return scripted_azure_server
