"""Headers → Principal. Keys are held as sha256 digests and compared in constant time; a key
past its `expires_at` is refused as expired, a secret replaced by a rotation is accepted until
the end of its grace period.

A caller presents its key as `x-portkey-api-key: <key>` or `Authorization: Bearer <key>` (the
Portkey header wins when both are sent: Portkey clients put a provider key in Authorization).
`x-portkey-virtual-key: NAME` asks for provider NAME directly; the key must list it.
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import hmac
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from core.errors import AuthenticationFailed, PermissionDenied
from gateway.config import Config, KeyConfig, TeamConfig


@dataclass(frozen=True, slots=True)
class Principal:
    key_id: str
    models: re.Pattern[str]  # the key's alias globs (and its team's), compiled once
    providers: frozenset[str]
    team: str | None = None

    def may_use_model(self, alias: str) -> bool:
        return self.models.fullmatch(alias) is not None

    def check_virtual_key(self, name: str, param: str = "x-portkey-virtual-key") -> None:
        """`param`: where the request named it (the header, or a Portkey config's target)."""
        if name not in self.providers:
            raise PermissionDenied(
                f"This API key may not use the virtual key '{name}'.", param=param
            )


@dataclass(frozen=True, slots=True)
class Entry:
    """One secret: its digest, its key's rights, and when it stops working (None: never)."""

    digest: bytes
    principal: Principal
    ends: float | None  # the key's expiry, or a rotated-out secret's end, whichever is first
    expired: bool  # past `ends`, the key has expired (else: a rotated-out secret is gone)


Clock = Callable[[], float]


class Authenticator:
    """Built per config, and again when the runtime keys change: every secret's digest (the
    YAML's keys, the runtime ones, and rotated-out secrets until their end) → its entry. A
    digest is found by a dict lookup, then compared in constant time: thousands of keys cost
    what one does. Admin keys are a list of their own: an inference key is not one, and an
    admin key is no inference key unless `auth.keys` lists it too."""

    def __init__(
        self,
        config: Config,
        keys: Iterable[KeyConfig] = (),
        teams: Mapping[str, TeamConfig] | None = None,
        clock: Clock = time.time,
    ) -> None:
        named = {k.id for k in config.keys}  # the YAML wins an id in both (refused at start)
        every = (*config.keys, *(k for k in keys if k.id not in named))
        all_teams = {**(teams or {}), **config.teams}
        self._clock = clock
        self._by_id: dict[str, Entry] = {}
        self._by_digest: dict[bytes, Entry] = {}
        for k in every:
            self._add(k, _principal(k, all_teams))
        self._admins = {a.sha256: a for a in config.admin_keys}

    def _add(self, k: KeyConfig, principal: Principal) -> None:
        entry = Entry(k.sha256, principal, k.expires_at, True)
        self._by_id[k.id] = entry
        for old in k.rotated:
            ends = old.until if k.expires_at is None else min(old.until, k.expires_at)
            expired = k.expires_at is not None and k.expires_at <= old.until
            self._by_digest.setdefault(old.sha256, Entry(old.sha256, principal, ends, expired))
        self._by_digest.setdefault(k.sha256, entry)  # a YAML key first: it wins a digest

    def principal(self, key_id: str) -> Principal | None:
        """The key with this id, unless it expired (a batch runs as the key that created it)."""
        entry = self._by_id.get(key_id)
        if entry is None or (entry.ends is not None and self._clock() >= entry.ends):
            return None
        return entry.principal

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        digest = hashlib.sha256(_presented_key(headers).encode()).digest()
        entry = self._by_digest.get(digest)
        if entry is None or not hmac.compare_digest(entry.digest, digest):
            raise AuthenticationFailed("Incorrect API key provided.")
        if entry.ends is not None and self._clock() >= entry.ends:
            raise AuthenticationFailed(
                "This API key has expired." if entry.expired else "Incorrect API key provided."
            )
        return entry.principal

    def admin(self, headers: Mapping[str, str]) -> str:
        """The id of the admin key presented: a 401 for an unknown key, a 403 for an inference
        key."""
        digest = hashlib.sha256(_presented_key(headers).encode()).digest()
        found = self._admins.get(digest)
        if found is not None and hmac.compare_digest(found.sha256, digest):
            return found.id
        self.authenticate(headers)  # an unknown or expired key: its 401
        raise PermissionDenied("This API key may not use the admin API: it takes an admin key.")


def _principal(k: KeyConfig, teams: Mapping[str, TeamConfig]) -> Principal:
    """A key's rights, bounded by its team's: a model both allow, a provider both list. A key
    whose team is gone (a runtime key's, removed meanwhile) may use nothing."""
    team = teams.get(k.team) if k.team is not None else None
    if k.team is not None and team is None:
        return Principal(k.id, _pattern((), None), frozenset(), k.team)
    providers = frozenset(k.providers)
    if team is not None and team.providers is not None:
        providers &= frozenset(team.providers)
    return Principal(k.id, _pattern(k.models, team.models if team else None), providers, k.team)


@functools.lru_cache(maxsize=1 << 16)
def _pattern(models: tuple[str, ...], bound: tuple[str, ...] | None) -> re.Pattern[str]:
    """Compiled once per process for each set of globs: the key check is built again whenever
    the runtime keys change, and compiling thousands of patterns each time would hold the
    event loop."""
    pattern = _alternatives(models)
    if bound is not None:
        pattern = f"(?={_alternatives(bound)}$)(?:{pattern})"
    return re.compile(pattern)


def _alternatives(globs: tuple[str, ...]) -> str:
    return "|".join(fnmatch.translate(g) for g in globs) or "(?!)"


def _presented_key(headers: Mapping[str, str]) -> str:
    key = headers.get("x-portkey-api-key")
    if key:
        return key.strip()
    auth = headers.get("authorization")
    if not auth:
        raise AuthenticationFailed(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <key>' "
            "or 'x-portkey-api-key: <key>'.",
            code="missing_api_key",
        )
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthenticationFailed(
            "The Authorization header must be 'Bearer <key>'.", code="invalid_authorization"
        )
    return token.strip()
