"""Authentication and routing decisions: who may call what, through which provider."""

from __future__ import annotations

import pytest

from core.errors import AuthenticationFailed, ModelNotFound, PermissionDenied
from gateway import config
from gateway.auth import Authenticator
from gateway.routing.plans import Router
from gateway.routing.trees import Group, leaves

CFG = config.parse(
    """
auth:
  keys:
    - {id: team-a, key: sk-a, models: ["llama-*"], providers: [fw]}
    - {id: team-b, key: sk-b, models: ["*"]}
providers:
  fw: {type: fireworks, base_url: "https://fw.example/inference/v1"}
  vl: {type: vllm-server, base_url: "http://vllm:8000/v1"}
models:
  llama-8b: {targets: [{provider: vl, model: meta/llama}, {provider: fw, model: acc/llama}]}
  gpt-x: {targets: [{provider: vl}]}
  lb:
    strategy: loadbalance
    targets: [{provider: vl, weight: 1}, {provider: fw, weight: 0.000001}]
"""
)
AUTH = Authenticator(CFG)
ROUTER = Router(CFG)


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Bearer sk-a"},
        {"x-portkey-api-key": "sk-a"},
        {"x-portkey-api-key": "sk-a", "authorization": "Bearer provider-key"},
        {"authorization": "bearer   sk-a  "},
    ],
)
def test_accepted_key_forms(headers: dict[str, str]) -> None:
    assert AUTH.authenticate(headers).key_id == "team-a"


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ({}, "missing_api_key"),
        ({"authorization": "Basic abc"}, "invalid_authorization"),
        ({"authorization": "Bearer sk-zzz"}, "invalid_api_key"),
        ({"authorization": "Bearer "}, "invalid_authorization"),
    ],
)
def test_rejected_keys(headers: dict[str, str], code: str) -> None:
    with pytest.raises(AuthenticationFailed) as info:
        AUTH.authenticate(headers)
    assert info.value.status == 401 and info.value.code == code


def test_model_permissions() -> None:
    a = AUTH.authenticate({"authorization": "Bearer sk-a"})
    assert ROUTER.plan(a, "llama-8b", None).first()[1].model == "meta/llama"
    with pytest.raises(PermissionDenied) as denied:
        ROUTER.plan(a, "gpt-x", None)
    assert denied.value.status == 403 and denied.value.param == "model"
    with pytest.raises(ModelNotFound) as missing:
        ROUTER.plan(a, "llama-unknown", None)
    assert missing.value.status == 404 and missing.value.code == "model_not_found"


def test_virtual_keys() -> None:
    a = AUTH.authenticate({"authorization": "Bearer sk-a"})
    b = AUTH.authenticate({"authorization": "Bearer sk-b"})
    # the alias's own target on that provider
    assert ROUTER.plan(a, "llama-8b", "fw").first()[1].model == "acc/llama"
    # otherwise the body's model is the provider's model id
    assert ROUTER.plan(a, "accounts/x/models/y", "fw").first()[1].label == "fw/accounts/x/models/y"
    # a virtual key does not unlock a configured alias the key may not use
    with pytest.raises(PermissionDenied) as denied:
        ROUTER.plan(a, "gpt-x", "fw")
    assert denied.value.param == "model"
    for principal, name in ((b, "fw"), (a, "vl"), (a, "nope")):
        with pytest.raises(PermissionDenied) as info:
            ROUTER.plan(principal, "llama-8b", name)
        assert info.value.param == "x-portkey-virtual-key"


def test_strategies() -> None:
    b = AUTH.authenticate({"authorization": "Bearer sk-b"})
    plan = ROUTER.plan(b, "llama-8b", None)
    assert leaves(plan.root) == (plan.root,) and plan.first()[1].provider == "vl"  # single
    lb = ROUTER.plan(b, "lb", None).root
    assert isinstance(lb, Group) and lb.weights == (1, 0.000001)
    assert {ROUTER.pick(list(lb.weights)) for _ in range(50)} == {0}
