"""Where the runtime keys and teams are kept, as the store (gateway.governance.store) sees it: a
versioned set of JSON records, read whole, changed only by a compare-and-set on its version, so
that two replicas changing it at once cannot both win (the loser reads again and decides again).
Two kinds: Redis (gateway.governance.redis_storage) and the files store
(gateway.governance.file_storage)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from core.wire import Json

# id → record (gateway.governance.records) as read: one that is not an object is left out, and
# said, when the set is read (gateway.governance.store).
Records = Mapping[str, object]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The whole set at one version ("": nothing was ever stored)."""

    version: str = ""
    keys: Records = field(default_factory=dict)
    teams: Records = field(default_factory=dict)

    def applied(self, changes: Changes, version: str) -> Snapshot:
        return Snapshot(
            version, _applied(self.keys, changes.keys), _applied(self.teams, changes.teams)
        )


@dataclass(frozen=True, slots=True)
class Changes:
    """Records to write, by id; None deletes."""

    keys: Mapping[str, Json | None] = field(default_factory=dict)
    teams: Mapping[str, Json | None] = field(default_factory=dict)


def _applied(records: Records, changes: Mapping[str, Json | None]) -> dict[str, object]:
    out = dict(records)
    for name, record in changes.items():
        if record is None:
            out.pop(name, None)
        else:
            out[name] = record
    return out


class Storage(Protocol):
    where: str  # for messages: "Redis at redis://…", "the files store ./data/files"

    async def version(self) -> str:
        """The newest version: cheap, asked every poll."""
        ...

    async def load(self) -> Snapshot: ...

    async def commit(self, base: Snapshot, changes: Changes) -> str | None:
        """Apply `changes` to `base` if it is still the newest version: the new version, or
        None if another change came first (nothing is written then)."""
        ...

    async def aclose(self) -> None: ...
