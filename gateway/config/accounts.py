"""Keys, teams and admin keys: `auth.keys`, `teams`, `auth.admin_keys` as typed data. The same
checks read the admin API's bodies (gateway.api.admin), so a key or team is one thing whether
the YAML or an admin call made it; every error names its path.

A key belongs to at most one team. A team bounds its keys: a key may use a model only if both
its own globs and its team's match it, a virtual key only if both list it, and the team's
limits and budget count all its keys' traffic together.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import ConfigError
from gateway.config.models import limits
from gateway.config.values import known, mapping, one_of, seq, text, unique
from gateway.governance.budgets import PERIODS, Budget
from gateway.governance.money import pico
from gateway.ratelimit import KeyLimits, Limits

ID = re.compile(r"[A-Za-z0-9._@+=-]{1,64}")  # ids land in Redis keys, URLs and metric labels
KEY_FIELDS = (
    "id", "key", "key_sha256", "models", "providers", "limits", "model_limits", "team",
    "budget", "model_budgets", "expires_at",
)  # fmt: skip
TEAM_FIELDS = ("id", "models", "providers", "limits", "budget", "model_budgets")


@dataclass(frozen=True, slots=True)
class Rotated:
    """A secret replaced by a rotation, accepted until `until` (epoch seconds)."""

    sha256: bytes
    until: float


@dataclass(frozen=True, slots=True)
class KeyConfig:
    id: str
    sha256: bytes  # digest of the key; the plaintext is never kept
    models: tuple[str, ...]  # alias globs
    providers: tuple[str, ...]  # virtual keys this key may use
    limits: KeyLimits = field(default_factory=lambda: KeyLimits(Limits(), ()))
    team: str | None = None
    budget: Budget | None = None
    model_budgets: tuple[tuple[str, Budget], ...] = ()  # (alias glob, budget), first match wins
    expires_at: float | None = None  # epoch seconds; refused from then on
    rotated: tuple[Rotated, ...] = ()
    runtime: bool = False  # made through the admin API (editable there), not the YAML
    created_at: int = 0


@dataclass(frozen=True, slots=True)
class TeamConfig:
    id: str
    models: tuple[str, ...] = ("*",)
    providers: tuple[str, ...] | None = None  # None: whatever its keys list
    limits: Limits = field(default_factory=Limits)
    budget: Budget | None = None
    model_budgets: tuple[tuple[str, Budget], ...] = ()
    runtime: bool = False
    created_at: int = 0


@dataclass(frozen=True, slots=True)
class AdminKey:
    id: str
    sha256: bytes


# ---------------------------------------------------------------- reading


def ident(v: Any, path: str) -> str:
    s = text(v, path)
    if not ID.fullmatch(s):
        raise ConfigError(path, "expected 1-64 characters of letters, digits and ._@+=-")
    return s


def budget(v: Any, path: str) -> Budget:
    m = mapping(v, path)
    known(m, path, ("usd", "period"))
    if "usd" not in m:
        raise ConfigError(f"{path}.usd", "required: the budget in US dollars")
    if "period" not in m:
        raise ConfigError(f"{path}.period", f"required: one of {', '.join(PERIODS)}")
    return Budget(pico(m["usd"], f"{path}.usd"), one_of(m["period"], f"{path}.period", PERIODS))  # type: ignore[arg-type]


def budgets(v: Any, path: str) -> tuple[tuple[str, Budget], ...]:
    m = mapping(v, path)
    return tuple((str(glob), budget(b, f"{path}.{glob}")) for glob, b in m.items())


def globs(v: Any, path: str) -> tuple[str, ...]:
    return tuple(text(g, f"{path}[{i}]") for i, g in enumerate(seq(v, path)))


def provider_names(v: Any, path: str, known_providers: Mapping[str, Any]) -> tuple[str, ...]:
    names = globs(v, path)
    for j, name in enumerate(names):
        if name not in known_providers:
            raise ConfigError(f"{path}[{j}]", f"unknown provider {name!r}")
    return names


def moment(v: Any, path: str) -> float | None:
    """An expiry: null, epoch seconds, or an ISO 8601 time with its zone (…Z)."""
    if v is None:
        return None
    if type(v) in (int, float) and v >= 0:
        return float(v)
    if isinstance(v, dt.datetime) and v.tzinfo is not None:  # YAML reads an unquoted one so
        return v.timestamp()
    if isinstance(v, str):
        try:
            when = dt.datetime.fromisoformat(v)
        except ValueError:
            when = None
        if when is not None and when.tzinfo is not None:
            return when.timestamp()
    raise ConfigError(
        path, "expected epoch seconds or an ISO 8601 time with a zone, e.g. 2027-01-01T00:00:00Z"
    )


def key_limits(k: Mapping[str, Any], path: str) -> KeyLimits:
    per_model = mapping(k.get("model_limits", {}), f"{path}.model_limits")
    return KeyLimits(
        limits(k.get("limits", {}), f"{path}.limits"),
        tuple(
            (str(glob), limits(v, f"{path}.model_limits.{glob}")) for glob, v in per_model.items()
        ),
    )


def key_entry(
    k: Mapping[str, Any],
    path: str,
    providers: Mapping[str, Any],
    teams: Mapping[str, TeamConfig],
    digest: bytes,
) -> KeyConfig:
    """A key's settings (its secret's digest read by the caller: the YAML gives it, an admin
    call makes it)."""
    team = None if k.get("team") is None else ident(k["team"], f"{path}.team")
    if team is not None and team not in teams:
        raise ConfigError(f"{path}.team", f"unknown team {team!r}")
    return KeyConfig(
        id=ident(k.get("id"), f"{path}.id"),
        sha256=digest,
        models=globs(k.get("models", ["*"]), f"{path}.models"),
        providers=provider_names(k.get("providers", []), f"{path}.providers", providers),
        limits=key_limits(k, path),
        team=team,
        budget=None if k.get("budget") is None else budget(k["budget"], f"{path}.budget"),
        model_budgets=budgets(k.get("model_budgets", {}), f"{path}.model_budgets"),
        expires_at=moment(k.get("expires_at"), f"{path}.expires_at"),
    )


def team_entry(
    t: Mapping[str, Any], path: str, team_id: str, providers: Mapping[str, Any]
) -> TeamConfig:
    given = t.get("providers")
    return TeamConfig(
        id=team_id,
        models=globs(t.get("models", ["*"]), f"{path}.models"),
        providers=None if given is None else provider_names(given, f"{path}.providers", providers),
        limits=limits(t.get("limits", {}), f"{path}.limits"),
        budget=None if t.get("budget") is None else budget(t["budget"], f"{path}.budget"),
        model_budgets=budgets(t.get("model_budgets", {}), f"{path}.model_budgets"),
    )


def digest(k: Mapping[str, Any], path: str) -> bytes:
    if ("key" in k) == ("key_sha256" in k):
        raise ConfigError(path, "set exactly one of 'key' and 'key_sha256'")
    if "key" in k:
        key = text(k["key"], f"{path}.key")
        if not key:
            raise ConfigError(f"{path}.key", "empty key")
        return hashlib.sha256(key.encode()).digest()
    hexed = text(k["key_sha256"], f"{path}.key_sha256").lower()
    if not re.fullmatch(r"[0-9a-f]{64}", hexed):
        raise ConfigError(f"{path}.key_sha256", "expected 64 hex digits (gateway hash-key KEY)")
    return bytes.fromhex(hexed)


# ---------------------------------------------------------------- the YAML's sections


def teams_section(
    section: Mapping[str, Any], providers: Mapping[str, Any]
) -> dict[str, TeamConfig]:
    out = {}
    for name, block in section.items():
        path = f"teams.{name}"
        t = mapping(block, path)
        known(t, path, TEAM_FIELDS[1:])
        out[ident(name, path)] = team_entry(t, path, str(name), providers)
    return out


def keys_section(
    auth: Mapping[str, Any], providers: Mapping[str, Any], teams: Mapping[str, TeamConfig]
) -> tuple[KeyConfig, ...]:
    out: list[KeyConfig] = []
    for i, entry in enumerate(seq(auth.get("keys", []), "auth.keys")):
        path = f"auth.keys[{i}]"
        k = mapping(entry, path)
        known(k, path, KEY_FIELDS)
        out.append(key_entry(k, path, providers, teams, digest(k, path)))
    unique([k.id for k in out], "auth.keys", "id")
    unique([k.sha256.hex() for k in out], "auth.keys", "key")
    return tuple(out)


def admin_section(auth: Mapping[str, Any]) -> tuple[AdminKey, ...]:
    out = []
    for i, entry in enumerate(seq(auth.get("admin_keys", []), "auth.admin_keys")):
        path = f"auth.admin_keys[{i}]"
        k = mapping(entry, path)
        known(k, path, ("id", "key", "key_sha256"))
        out.append(AdminKey(ident(k.get("id"), f"{path}.id"), digest(k, path)))
    unique([k.id for k in out], "auth.admin_keys", "id")
    unique([k.sha256.hex() for k in out], "auth.admin_keys", "key")
    return tuple(out)
