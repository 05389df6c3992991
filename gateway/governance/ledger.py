"""The spend ledger: what requests cost, per UTC day, by key, team and model. Each day is one
hash of pico-dollar counters ("s:20261128" → "k:<key id>", "t:<team>", "m:<model>"), added to
where the limits are kept (Redis, in the limiter's own calls; or the memory backend) and kept
400 days."""

from __future__ import annotations

import datetime as dt
import functools
import time

from gateway.ratelimit.rules import Spend

KEEP_DAYS = 400
GROUPS = {"key": "k:", "team": "t:", "model": "m:"}  # group_by → the fields' prefix


def day_hash(day: dt.date) -> str:
    return "s:" + day.strftime("%Y%m%d")


def ledger(
    key_id: str, team: str | None, model: str, amount: int, now: dt.datetime | None = None
) -> Spend:
    """What one request's cost adds, on the UTC day it ended."""
    day = day_hash(now.date()) if now is not None else _today(int(time.time() // 86400))
    if team:
        return (day, ("k:" + key_id, "m:" + model, "t:" + team), amount)
    return (day, ("k:" + key_id, "m:" + model), amount)


@functools.lru_cache(maxsize=2)  # named once a day, not per request
def _today(number: int) -> str:
    return day_hash(dt.date(1970, 1, 1) + dt.timedelta(days=number))
