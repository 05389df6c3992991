"""What limits apply to a request: the config's limits as typed data, and their resolution for
one (key, model) pair into `Rule`s, each naming its bucket.

Four scopes, each with requests per minute, tokens per minute and parallel requests:
`key` (all of one key's traffic), `team` (all of its keys' traffic), `model` (all keys' traffic
to one alias) and `key_model` (one key on one model; `auth.keys[].model_limits` maps alias globs
to limits, each matching alias getting its own bucket).

Budgets are rules too (kind `budget`, in pico-dollars), admitted with the others in the same
decision: per key, per team, per key and model (`model_budgets`) and per team and model. A
budget's bucket is named after its period, so the rules of a (key, model) are found again once
the earliest of their periods ends.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import hashlib
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gateway.governance.budgets import Budget, Window, window

Kind = Literal["requests", "tokens", "parallel", "budget"]
LimitScope = Literal["key", "team", "model", "key_model", "team_model"]
BackendName = Literal["memory", "redis"]
Mode = Literal["local", "open", "closed"]

WINDOW_S = 60.0  # rpm and tpm are per minute; a bucket holds a minute's worth
KIND_OF = {"rpm": "requests", "tpm": "tokens", "max_parallel": "parallel"}
_PLAIN = re.compile(r"[A-Za-z0-9._/@+=-]{1,80}")


@dataclass(frozen=True, slots=True)
class Limits:
    """One scope's limits; None is "no limit"."""

    rpm: int | None = None
    tpm: int | None = None
    max_parallel: int | None = None

    def items(self) -> tuple[tuple[Kind, int], ...]:
        values = (("requests", self.rpm), ("tokens", self.tpm), ("parallel", self.max_parallel))
        return tuple((k, v) for k, v in values if v is not None)  # type: ignore[misc]


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failures: int = 3  # consecutive backend failures that open the breaker
    cooldown_s: float = 5.0  # how long an open breaker skips the backend before probing


@dataclass(frozen=True, slots=True)
class RateLimitConfig:
    backend: BackendName = "memory"
    redis_url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = False  # redis_url names one node of a Redis Cluster
    on_backend_error: Mode = "local"
    replicas: int = 1  # `local` mode divides every limit by this
    key_prefix: str = "llmgw"  # the Redis hash tag: every limiter key is in one slot
    timeout_ms: int = 100  # per Redis call: connect, send and answer
    pool_size: int = 32
    lease_s: float = 60.0  # a parallel slot of a vanished replica frees itself after this
    breaker: BreakerConfig = field(default_factory=BreakerConfig)


@dataclass(frozen=True, slots=True)
class Rule:
    """One limit that applies to a request."""

    scope: LimitScope
    kind: Kind
    limit: int
    bucket: str  # unique name of the state this limit keeps
    subject: str  # how messages name it: "key 'team-a'", "model 'x'"
    budget: Budget | None = field(default=None, compare=False)  # a budget's: its period…
    window: Window | None = field(default=None, compare=False)  # …and the one it counts now
    # Derived once, used per request: seconds per unit, and the limit as a header value.
    interval: float = field(init=False, repr=False, compare=False)
    limit_header: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", WINDOW_S / self.limit if self.limit else math.inf)
        object.__setattr__(self, "limit_header", b"%d" % self.limit)

    def scaled(self, divisor: int) -> Rule:
        """This rule with its limit shared among `divisor` replicas (at least 1)."""
        if divisor == 1:
            return self
        limit = max(1, self.limit // divisor)
        return Rule(
            self.scope, self.kind, limit, self.bucket, self.subject, self.budget, self.window
        )


Reported = tuple[tuple[Kind, tuple[int, ...]], ...]  # per kind in the headers: its rules' indices
Rate = tuple[str, float, bool]  # a requests or tokens rule: bucket, seconds per unit, per token?


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The rules of one (key, model), and what the request path needs to know of them, found
    once: nobody scans the rules per request. The requests and tokens rules come first, so an
    index means the same rule in `rules` and in `rates`."""

    rules: tuple[Rule, ...]
    tokens: bool
    parallel: bool
    max_tokens: int | None  # the smallest tpm: a reservation above it can never be admitted
    rates: tuple[Rate, ...]  # the requests and tokens rules, as GCRA reads them
    slots: tuple[tuple[str, int], ...]  # the parallel rules: bucket, limit
    reported: Reported  # the requests and tokens rules, which the response headers report
    # The budget rules (last in `rules`): bucket, limit in pico-dollars, and how long its
    # counter is kept (0: forever).
    budgets: tuple[tuple[str, int, int], ...] = ()
    until: float = math.inf  # epoch seconds: the earliest end of a budget's period

    @classmethod
    def of(cls, rules: tuple[Rule, ...], now: dt.datetime | None = None) -> RuleSet:
        rules = tuple(sorted(rules, key=lambda r: ORDER[r.kind]))
        tpm = [r.limit for r in rules if r.kind == "tokens"]
        budgets = [r for r in rules if r.kind == "budget"]
        now = now or dt.datetime.now(dt.UTC)
        reported = tuple(
            (kind, ix)
            for kind in ("requests", "tokens")
            if (ix := tuple(i for i, r in enumerate(rules) if r.kind == kind))
        )
        return cls(
            rules,
            tokens=bool(tpm),
            parallel=any(r.kind == "parallel" for r in rules),
            max_tokens=min(tpm, default=None),
            rates=tuple((r.bucket, r.interval, r.kind == "tokens") for r in rules if _rate(r)),
            slots=tuple((r.bucket, r.limit) for r in rules if r.kind == "parallel"),
            reported=reported,  # type: ignore[arg-type]
            budgets=tuple((r.bucket, r.limit, _ttl(r, now)) for r in budgets),
            until=min(
                (r.window.ends.timestamp() for r in budgets if r.window and r.window.ends),
                default=math.inf,
            ),
        )

    @property
    def budgeted(self) -> bool:
        return bool(self.budgets)


ORDER = {"requests": 0, "tokens": 0, "parallel": 1, "budget": 2}


def _rate(rule: Rule) -> bool:
    return rule.kind in ("requests", "tokens")


def _ttl(rule: Rule, now: dt.datetime) -> int:
    return rule.window.ttl_s(now) if rule.window is not None else 0


Budgets = tuple[tuple[str, Budget], ...]  # (alias glob, budget), first match wins


@dataclass(frozen=True, slots=True)
class KeyLimits:
    limits: Limits
    per_model: tuple[tuple[str, Limits], ...]  # (alias glob, limits), first match wins
    team: str | None = None
    budget: Budget | None = None
    model_budgets: Budgets = ()

    @property
    def limited(self) -> bool:
        return (
            bool(self.limits.items())
            or any(lim.items() for _, lim in self.per_model)
            or self.budget is not None
            or bool(self.model_budgets)
        )


@dataclass(frozen=True, slots=True)
class TeamLimits:
    limits: Limits = field(default_factory=Limits)
    budget: Budget | None = None
    model_budgets: Budgets = ()

    @property
    def limited(self) -> bool:
        return bool(self.limits.items()) or self.budget is not None or bool(self.model_budgets)


class RuleBook:
    """Resolves (key id, model) to its rules once and remembers the answer for configured
    aliases (a bounded set); virtual-key model ids are resolved per request.

    `models` holds every configured alias (Limits() for one without limits of its own)."""

    def __init__(
        self,
        keys: Mapping[str, KeyLimits],
        models: Mapping[str, Limits],
        teams: Mapping[str, TeamLimits] | None = None,
    ) -> None:
        self._keys = keys
        self._models = models
        self._teams = teams or {}
        self._cache: dict[tuple[str, str], RuleSet] = {}

    def key_teams(self) -> list[tuple[str, str | None]]:
        """Every key's id and team."""
        return [(key_id, k.team) for key_id, k in self._keys.items()]

    def rules(self, key_id: str, model: str) -> RuleSet:
        found = self._cache.get((key_id, model))
        if found is None or (found.budgets and found.until <= time.time()):
            now = dt.datetime.now(dt.UTC)
            found = RuleSet.of(self._resolve(key_id, model, now), now)
            if model in self._models:
                self._cache[(key_id, model)] = found
        return found

    def _resolve(self, key_id: str, model: str, now: dt.datetime) -> tuple[Rule, ...]:
        m = _bucket_name(model)
        out: list[Rule] = []
        key = self._keys.get(key_id)
        if key is not None:
            who = f"key '{key_id}'"
            out += _rules("key", key.limits, f"k:{key_id}", who)
            for glob, limits in key.per_model:
                if fnmatch.fnmatchcase(model, glob):
                    subject = f"model '{model}' on key '{key_id}'"
                    out += _rules("key_model", limits, f"km:{key_id}:{m}", subject)
                    break
            out += _budgets("key", key.budget, f"b:k:{key_id}", who, now)
            out += _model_budget(
                "key_model", key.model_budgets, model, f"b:km:{key_id}:{m}", who, now
            )
            team = self._teams.get(key.team) if key.team is not None else None
            if team is not None:
                who = f"team '{key.team}'"
                out += _rules("team", team.limits, f"T:{key.team}", who)
                out += _budgets("team", team.budget, f"b:t:{key.team}", who, now)
                out += _model_budget(
                    "team_model", team.model_budgets, model, f"b:tm:{key.team}:{m}", who, now
                )
        model_limits = self._models.get(model)
        if model_limits is not None:
            out += _rules("model", model_limits, f"m:{m}", f"model '{model}'")
        return tuple(out)


def _rules(scope: LimitScope, limits: Limits, bucket: str, subject: str) -> list[Rule]:
    short = {"requests": "r", "tokens": "t", "parallel": "p"}
    return [
        Rule(scope, kind, value, f"{bucket}:{short[kind]}", subject)
        for kind, value in limits.items()
    ]


def _budgets(
    scope: LimitScope, budget: Budget | None, bucket: str, subject: str, now: dt.datetime
) -> list[Rule]:
    if budget is None:
        return []
    w = window(budget.period, now)
    return [Rule(scope, "budget", budget.pico, f"{bucket}:{w.stamp}", subject, budget, w)]


def _model_budget(
    scope: LimitScope, table: Budgets, model: str, bucket: str, who: str, now: dt.datetime
) -> list[Rule]:
    for glob, budget in table:
        if fnmatch.fnmatchcase(model, glob):
            return _budgets(scope, budget, bucket, f"model '{model}' on {who}", now)
    return []


def _bucket_name(model: str) -> str:
    """Model ids from virtual-key requests are the caller's text: long or odd ones are hashed."""
    if _PLAIN.fullmatch(model):
        return model
    return "h-" + hashlib.sha256(model.encode()).hexdigest()[:24]


# What one request adds to the spend ledger: the day's hash ("s:20261128"), its fields
# ("k:<key id>", "m:<model>", and "t:<team>" when it has one), and the amount in pico-dollars
# added to each field. One entry a request: the backends tally entries alike before they split
# them into fields.
Spend = tuple[str, tuple[str, ...], int]


@dataclass(slots=True)  # not frozen: built per request, and frozen ones build slowly
class Ask:
    """One admission: every rule that applies, the tokens to reserve, and the lease that holds
    the request's parallel slots."""

    limits: RuleSet
    tokens: int
    lease: str
    cost: int = 0  # pico-dollars reserved against the budgets: the most the request may cost

    @property
    def rules(self) -> tuple[Rule, ...]:
        return self.limits.rules


@dataclass(slots=True)  # not frozen: built per request, and frozen ones build slowly
class State:
    """A rule's state after a decision (if refused: as it stands, nothing was taken)."""

    rule: Rule
    remaining: int
    reset_s: float  # until the bucket is full again
    retry_s: float  # > 0: this rule refused, and could admit the request after this long


Values = tuple[int, float, float]  # a rule's (remaining, reset s, retry s): see State


@dataclass(slots=True)  # not frozen: built per request, and frozen ones build slowly
class Verdict:
    """A decision and, per rule of the Ask (in order), its values after it. Plain tuples,
    not States: this is built for every request, and States are needed only to explain."""

    admitted: bool
    rules: tuple[Rule, ...]
    values: list[Values]

    @property
    def states(self) -> tuple[State, ...]:
        return tuple(State(r, *v) for r, v in zip(self.rules, self.values, strict=True))
