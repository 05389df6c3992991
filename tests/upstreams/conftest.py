"""The scripted-upstream fixtures, for this folder's self-tests."""

from tests.upstreams.fixtures import (  # noqa: F401  (pytest fixtures)
    scripted_azure,
    scripted_azure_server,
    scripted_fireworks,
    scripted_fireworks_server,
    scripted_openai,
    scripted_openai_server,
)
