"""Keys and teams as JSON: the fields an admin call sends (the YAML's shape), what the runtime
store keeps of a key or team (those fields, its secret's digest, its rotated secrets, when it
was made), and the objects the admin API shows (never a secret nor its digest).

A stored record is read back without the config's cross-checks (a provider or team it names
may have left the YAML since: the key then simply cannot use it), but with the same readers
as the YAML, so a record is one thing whichever process wrote it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from core.wire import Json
from gateway.config.accounts import (
    KeyConfig,
    Rotated,
    TeamConfig,
    budget,
    budgets,
    globs,
    ident,
    key_limits,
    moment,
)
from gateway.config.models import limits as read_limits
from gateway.governance.budgets import Budget
from gateway.governance.money import usd
from gateway.ratelimit import Limits

KEY_OBJECT, TEAM_OBJECT = "gateway.key", "gateway.team"


# ---------------------------------------------------------------- the fields, as sent


def limits_fields(lim: Limits) -> dict[str, int]:
    given = {"rpm": lim.rpm, "tpm": lim.tpm, "max_parallel": lim.max_parallel}
    return {k: v for k, v in given.items() if v is not None}


def budget_fields(b: Budget | None) -> Json | None:
    return None if b is None else {"usd": usd(b.pico), "period": b.period}


def epoch(moment_s: float | None) -> int | float | None:
    """Epoch seconds as JSON shows them: whole ones as an integer."""
    if moment_s is None:
        return None
    return int(moment_s) if moment_s == int(moment_s) else moment_s


def key_fields(k: KeyConfig) -> Json:
    """A key's settings in the shape an admin call sends them (and the YAML holds them)."""
    return {
        "models": list(k.models),
        "providers": list(k.providers),
        "limits": limits_fields(k.limits.limits),
        "model_limits": {glob: limits_fields(lim) for glob, lim in k.limits.per_model},
        "team": k.team,
        "budget": budget_fields(k.budget),
        "model_budgets": {glob: budget_fields(b) for glob, b in k.model_budgets},
        "expires_at": epoch(k.expires_at),
    }


def team_fields(t: TeamConfig) -> Json:
    return {
        "models": list(t.models),
        "providers": None if t.providers is None else list(t.providers),
        "limits": limits_fields(t.limits),
        "budget": budget_fields(t.budget),
        "model_budgets": {glob: budget_fields(b) for glob, b in t.model_budgets},
    }


# ---------------------------------------------------------------- what the store keeps


def key_record(k: KeyConfig) -> Json:
    return {
        **key_fields(k),
        "sha256": k.sha256.hex(),
        "rotated": [[r.sha256.hex(), r.until] for r in k.rotated],
        "created_at": k.created_at,
    }


def team_record(t: TeamConfig) -> Json:
    return {**team_fields(t), "created_at": t.created_at}


def key_from_record(key_id: str, r: Mapping[str, Any]) -> KeyConfig:
    """Raises ConfigError, KeyError, ValueError or TypeError for a record it cannot read."""
    path = f"keys.{key_id}"
    team = r.get("team")
    return KeyConfig(
        id=ident(key_id, f"{path}.id"),
        sha256=bytes.fromhex(r["sha256"]),
        models=globs(r.get("models", ["*"]), f"{path}.models"),
        providers=globs(r.get("providers", []), f"{path}.providers"),
        limits=key_limits(r, path),
        team=None if team is None else ident(team, f"{path}.team"),
        budget=None if r.get("budget") is None else budget(r["budget"], f"{path}.budget"),
        model_budgets=budgets(r.get("model_budgets", {}), f"{path}.model_budgets"),
        expires_at=moment(r.get("expires_at"), f"{path}.expires_at"),
        rotated=tuple(Rotated(bytes.fromhex(h), float(u)) for h, u in r.get("rotated", [])),
        runtime=True,
        created_at=int(r.get("created_at", 0)),
    )


def team_from_record(team_id: str, r: Mapping[str, Any]) -> TeamConfig:
    path = f"teams.{team_id}"
    given = r.get("providers")
    return TeamConfig(
        id=ident(team_id, path),
        models=globs(r.get("models", ["*"]), f"{path}.models"),
        providers=None if given is None else globs(given, f"{path}.providers"),
        limits=read_limits(r.get("limits", {}), f"{path}.limits"),
        budget=None if r.get("budget") is None else budget(r["budget"], f"{path}.budget"),
        model_budgets=budgets(r.get("model_budgets", {}), f"{path}.model_budgets"),
        runtime=True,
        created_at=int(r.get("created_at", 0)),
    )


# ---------------------------------------------------------------- what the admin API shows


def source(runtime: bool) -> str:
    return "runtime" if runtime else "config"


def key_object(k: KeyConfig, now: float | None = None) -> Json:
    """`rotated_until`: when the last secret a rotation replaced stops working (null: none
    does any more)."""
    now = time.time() if now is None else now
    until = max((r.until for r in k.rotated if r.until > now), default=None)
    return {
        "id": k.id,
        "object": KEY_OBJECT,
        "source": source(k.runtime),
        **key_fields(k),
        "created_at": k.created_at or None,
        "rotated_until": epoch(until),
    }


def team_object(t: TeamConfig) -> Json:
    return {
        "id": t.id,
        "object": TEAM_OBJECT,
        "source": source(t.runtime),
        **team_fields(t),
        "created_at": t.created_at or None,
    }
