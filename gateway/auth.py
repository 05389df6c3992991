"""Headers → Principal. Keys are held as sha256 digests and compared in constant time.

A caller presents its key as `x-portkey-api-key: <key>` or `Authorization: Bearer <key>` (the
Portkey header wins when both are sent: Portkey clients put a provider key in Authorization).
`x-portkey-virtual-key: NAME` asks for provider NAME directly; the key must list it.
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
from collections.abc import Mapping
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


class Authenticator:
    """Built once per config: the key digests and their principals."""

    def __init__(self, config: Config) -> None:
        self._keys: tuple[tuple[bytes, Principal], ...] = tuple(
            (k.sha256, _principal(k, config.teams.get(k.team) if k.team else None))
            for k in config.keys
        )

    def principal(self, key_id: str) -> Principal | None:
        """The configured key with this id (a batch runs as the key that created it)."""
        return next((p for _, p in self._keys if p.key_id == key_id), None)

    def authenticate(self, headers: Mapping[str, str]) -> Principal:
        digest = hashlib.sha256(_presented_key(headers).encode()).digest()
        found: Principal | None = None
        for stored, principal in self._keys:  # no early exit: the time is the same for any key
            if hmac.compare_digest(stored, digest):
                found = principal
        if found is None:
            raise AuthenticationFailed("Incorrect API key provided.")
        return found


def _principal(k: KeyConfig, team: TeamConfig | None) -> Principal:
    """A key's rights, bounded by its team's: a model both allow, a provider both list."""
    pattern = _alternatives(k.models)
    providers = frozenset(k.providers)
    if team is not None:
        pattern = f"(?={_alternatives(team.models)}$)(?:{pattern})"
        if team.providers is not None:
            providers &= frozenset(team.providers)
    return Principal(k.id, re.compile(pattern), providers, k.team)


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
