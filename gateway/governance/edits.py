"""What each admin call changes in the runtime keys and teams, decided on one set of them
(gateway.governance.store decides again on the newest set if another change came first).

The bodies are read by the YAML's own readers (gateway.config.accounts): a bad field is a 400
whose `param` names it. The YAML's keys and teams are shown but never changed here (a 403 that
says the config file defines them); an id taken in either is a 409.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from core.errors import ConfigError, Conflict, InvalidRequest, NotFound, PermissionDenied
from core.wire import Json
from gateway.config import Config, KeyConfig, TeamConfig
from gateway.config.accounts import Rotated, ident, key_entry, team_entry
from gateway.config.values import nonnegative
from gateway.governance import records
from gateway.governance.store import AccountSet, Edit

SECRET_PREFIX = "sk-gw-"
SECRET_BYTES = 32
KEY_FIELDS = (
    "id", "models", "providers", "limits", "model_limits", "team", "budget", "model_budgets",
    "expires_at",
)  # fmt: skip
TEAM_FIELDS = ("id", "models", "providers", "limits", "budget", "model_budgets")
MAX_GRACE_S = 30 * 86400
T = TypeVar("T")
Decide = Callable[[AccountSet], Edit[T]]  # a change, decided on the set it is given


@dataclass(frozen=True, slots=True)
class Issued:
    """A key with a new secret: the secret is shown once, in this answer, and never kept."""

    key: KeyConfig
    secret: str


def new_secret() -> str:
    return SECRET_PREFIX + secrets.token_urlsafe(SECRET_BYTES)


def digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


# ---------------------------------------------------------------- finding


def find_key(config: Config, current: AccountSet, key_id: str) -> KeyConfig:
    for k in config.keys:
        if k.id == key_id:
            return k
    found = current.keys.get(key_id)
    if found is None:
        raise NotFound(f"No key has the id '{key_id}'.", param="id")
    return found


def find_team(config: Config, current: AccountSet, team_id: str) -> TeamConfig:
    found = config.teams.get(team_id) or current.teams.get(team_id)
    if found is None:
        raise NotFound(f"No team has the id '{team_id}'.", param="id")
    return found


def _runtime_key(config: Config, current: AccountSet, key_id: str) -> KeyConfig:
    k = find_key(config, current, key_id)
    if not k.runtime:
        where = next(i for i, c in enumerate(config.keys) if c.id == key_id)
        raise PermissionDenied(
            f"The key '{key_id}' is defined in the config file (auth.keys[{where}]): change it "
            "there."
        )
    return k


def _runtime_team(config: Config, current: AccountSet, team_id: str) -> TeamConfig:
    t = find_team(config, current, team_id)
    if not t.runtime:
        raise PermissionDenied(
            f"The team '{team_id}' is defined in the config file (teams.{team_id}): change it "
            "there."
        )
    return t


# ---------------------------------------------------------------- keys


def create_key(config: Config, body: Json) -> Decide[Issued]:
    given = _present(_fields(body, KEY_FIELDS, "key"))

    def decide(current: AccountSet) -> Edit[Issued]:
        key_id = _new_id(given, "key-")
        if key_id in current.keys or any(k.id == key_id for k in config.keys):
            raise Conflict(f"A key with the id '{key_id}' exists already.", param="id")
        secret = new_secret()
        k = _read_key({**given, "id": key_id}, config, current, digest(secret))
        k = replace(k, runtime=True, created_at=int(time.time()))
        return Edit({k.id: k}, {}, Issued(k, secret))

    return decide


def update_key(config: Config, key_id: str, body: Json) -> Decide[KeyConfig]:
    given = _fields(body, KEY_FIELDS[1:], "key")

    def decide(current: AccountSet) -> Edit[KeyConfig]:
        old = _runtime_key(config, current, key_id)
        merged = _present({**records.key_fields(old), **given, "id": key_id})
        k = _read_key(merged, config, current, old.sha256)
        k = replace(k, rotated=old.rotated, runtime=True, created_at=old.created_at)
        return Edit({key_id: k}, {}, k)

    return decide


def delete_key(config: Config, key_id: str) -> Decide[KeyConfig]:
    def decide(current: AccountSet) -> Edit[KeyConfig]:
        return Edit({key_id: None}, {}, _runtime_key(config, current, key_id))

    return decide


def rotate_key(config: Config, key_id: str, body: Json) -> Decide[Issued]:
    """A new secret; the one it replaces keeps working for `grace_s` (0: not at all), as do
    those of earlier rotations whose grace has not ended."""
    grace = _grace(_fields(body, ("grace_s",), "rotation").get("grace_s", 0))

    def decide(current: AccountSet) -> Edit[Issued]:
        old = _runtime_key(config, current, key_id)
        now = time.time()
        kept = tuple(r for r in old.rotated if r.until > now)
        if grace > 0:
            kept += (Rotated(old.sha256, now + grace),)
        secret = new_secret()
        k = replace(old, sha256=digest(secret), rotated=kept)
        return Edit({key_id: k}, {}, Issued(k, secret))

    return decide


def _read_key(
    fields: Mapping[str, Any], config: Config, current: AccountSet, sha256: bytes
) -> KeyConfig:
    teams = {**current.teams, **config.teams}
    with _as_request():
        return key_entry(fields, "", config.providers, teams, sha256)


def _grace(v: object) -> float:
    with _as_request():
        grace = nonnegative(v, ".grace_s")
        if grace > MAX_GRACE_S:
            raise ConfigError(".grace_s", f"at most {MAX_GRACE_S} seconds (30 days)")
    return grace


# ---------------------------------------------------------------- teams


def create_team(config: Config, body: Json) -> Decide[TeamConfig]:
    given = _present(_fields(body, TEAM_FIELDS, "team"))

    def decide(current: AccountSet) -> Edit[TeamConfig]:
        team_id = _new_id(given, "team-")
        if team_id in current.teams or team_id in config.teams:
            raise Conflict(f"A team with the id '{team_id}' exists already.", param="id")
        t = _read_team(given, team_id, config)
        t = replace(t, runtime=True, created_at=int(time.time()))
        return Edit({}, {team_id: t}, t)

    return decide


def update_team(config: Config, team_id: str, body: Json) -> Decide[TeamConfig]:
    given = _fields(body, TEAM_FIELDS[1:], "team")

    def decide(current: AccountSet) -> Edit[TeamConfig]:
        old = _runtime_team(config, current, team_id)
        merged = _present({**records.team_fields(old), **given})
        t = replace(_read_team(merged, team_id, config), runtime=True, created_at=old.created_at)
        return Edit({}, {team_id: t}, t)

    return decide


def delete_team(config: Config, team_id: str) -> Decide[TeamConfig]:
    """Refused (409) while keys belong to the team: they would lose the bounds it sets."""

    def decide(current: AccountSet) -> Edit[TeamConfig]:
        t = _runtime_team(config, current, team_id)
        members = sorted(k.id for k in current.keys.values() if k.team == team_id)
        if members:
            raise Conflict(
                f"The team '{team_id}' still has keys: {', '.join(members)}. Delete them or "
                "move them to another team first.",
                param="id",
            )
        return Edit({}, {team_id: None}, t)

    return decide


def _read_team(fields: Mapping[str, Any], team_id: str, config: Config) -> TeamConfig:
    with _as_request():
        return team_entry(fields, "", team_id, config.providers)


# ---------------------------------------------------------------- bodies


def _fields(body: Json, allowed: tuple[str, ...], what: str) -> Json:
    unknown = [name for name in body if name not in allowed]
    if unknown:
        raise InvalidRequest(
            f"Unknown field(s): {', '.join(map(repr, unknown))}. A {what} takes "
            f"{', '.join(allowed)}.",
            param=unknown[0],
        )
    return body


def _present(fields: Json) -> Json:
    """Null is "not set": the field's default."""
    return {name: v for name, v in fields.items() if v is not None}


def _new_id(given: Json, prefix: str) -> str:
    if "id" not in given:
        return prefix + secrets.token_hex(8)
    with _as_request():
        return ident(given["id"], ".id")


@contextlib.contextmanager
def _as_request() -> Iterator[None]:
    """The YAML's readers name a path ("" for the body: ".limits.rpm"): a 400 naming the field."""
    try:
        yield
    except ConfigError as err:
        param = err.path.lstrip(".")
        raise InvalidRequest(f"Invalid '{param}': {err.message}.", param=param) from None
