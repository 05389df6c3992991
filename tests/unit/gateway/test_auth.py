"""Authentication and routing decisions: who may call what, through which provider."""

from __future__ import annotations

import hashlib

import pytest

from core.errors import AuthenticationFailed, ModelNotFound, PermissionDenied
from gateway import config
from gateway.auth import Authenticator
from gateway.config import KeyConfig, TeamConfig
from gateway.config.accounts import Rotated
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


# ---------------------------------------------------------------- runtime keys, expiry, rotation

GOVERNED = config.parse(
    """
auth:
  keys:
    - {id: yaml-key, key: sk-yaml, models: ["*"], expires_at: 2000}
  admin_keys:
    - {id: ops, key: sk-admin}
providers:
  fw: {type: fireworks, base_url: "https://fw.example/inference/v1"}
teams:
  research: {models: ["llama-*"], providers: [fw]}
"""
)


def secret(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_runtime_keys_are_found_by_their_digest_and_their_id() -> None:
    keys = [KeyConfig(f"k{i}", secret(f"sk-{i}"), ("*",), (), runtime=True) for i in range(5000)]
    auth = Authenticator(GOVERNED, keys, clock=Clock(1000))
    assert auth.authenticate(bearer("sk-4321")).key_id == "k4321"
    assert auth.authenticate(bearer("sk-yaml")).key_id == "yaml-key"
    principal = auth.principal("k17")
    assert principal is not None and principal.key_id == "k17"
    assert auth.principal("gone") is None


def test_an_expired_key_is_refused_as_expired() -> None:
    clock = Clock(1999.5)
    auth = Authenticator(GOVERNED, clock=clock)
    assert auth.authenticate(bearer("sk-yaml")).key_id == "yaml-key"
    clock.now = 2000
    with pytest.raises(AuthenticationFailed) as refused:
        auth.authenticate(bearer("sk-yaml"))
    assert refused.value.message == "This API key has expired."
    assert (refused.value.status, refused.value.code) == (401, "invalid_api_key")
    assert auth.principal("yaml-key") is None  # its batches stop too


def test_a_rotated_out_secret_works_until_its_grace_ends() -> None:
    key = KeyConfig(
        "rot", secret("sk-new"), ("*",), (), rotated=(Rotated(secret("sk-old"), 500.0),),
        runtime=True,
    )  # fmt: skip
    clock = Clock(499)
    auth = Authenticator(GOVERNED, [key], clock=clock)
    assert auth.authenticate(bearer("sk-old")).key_id == "rot"
    assert auth.authenticate(bearer("sk-new")).key_id == "rot"
    clock.now = 500
    with pytest.raises(AuthenticationFailed) as refused:
        auth.authenticate(bearer("sk-old"))
    assert refused.value.message == "Incorrect API key provided."
    assert auth.authenticate(bearer("sk-new")).key_id == "rot"


def test_a_rotated_out_secret_of_a_key_that_expires_first_is_expired() -> None:
    key = KeyConfig(
        "rot", secret("sk-new"), ("*",), (), expires_at=300.0,
        rotated=(Rotated(secret("sk-old"), 500.0),), runtime=True,
    )  # fmt: skip
    auth = Authenticator(GOVERNED, [key], clock=Clock(400))
    for presented in ("sk-old", "sk-new"):
        with pytest.raises(AuthenticationFailed, match="expired"):
            auth.authenticate(bearer(presented))


def test_a_runtime_key_is_bounded_by_its_team_and_a_gone_team_allows_nothing() -> None:
    teams = {"rt": TeamConfig("rt", ("gpt-*",), None, runtime=True)}
    keys = [
        KeyConfig("in-yaml-team", secret("sk-1"), ("*",), ("fw",), team="research", runtime=True),
        KeyConfig("in-rt-team", secret("sk-2"), ("*",), (), team="rt", runtime=True),
        KeyConfig("orphan", secret("sk-3"), ("*",), ("fw",), team="gone", runtime=True),
    ]
    auth = Authenticator(GOVERNED, keys, teams)
    one = auth.authenticate(bearer("sk-1"))
    assert one.may_use_model("llama-8b") and not one.may_use_model("gpt-x")
    assert one.providers == {"fw"} and one.team == "research"
    two = auth.authenticate(bearer("sk-2"))
    assert two.may_use_model("gpt-x") and not two.may_use_model("llama-8b")
    orphan = auth.authenticate(bearer("sk-3"))
    assert not orphan.may_use_model("llama-8b") and not orphan.providers


def test_a_yaml_key_wins_an_id_in_both() -> None:
    twin = KeyConfig("yaml-key", secret("sk-twin"), ("*",), (), runtime=True)
    auth = Authenticator(GOVERNED, [twin], clock=Clock(0))
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(bearer("sk-twin"))


def test_admin_keys_are_a_list_of_their_own() -> None:
    auth = Authenticator(GOVERNED, clock=Clock(0))
    assert auth.admin(bearer("sk-admin")) == "ops"
    assert auth.admin({"x-portkey-api-key": "sk-admin"}) == "ops"
    with pytest.raises(PermissionDenied) as denied:
        auth.admin(bearer("sk-yaml"))  # an inference key
    assert denied.value.status == 403 and denied.value.code == "permission_denied"
    for headers in (bearer("sk-nope"), {}):
        with pytest.raises(AuthenticationFailed):
            auth.admin(headers)
    with pytest.raises(AuthenticationFailed):
        auth.authenticate(bearer("sk-admin"))  # not an inference key
