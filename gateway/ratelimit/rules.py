"""What limits apply to a request: the config's limits as typed data, and their resolution for
one (key, model) pair into `Rule`s, each naming its bucket.

Three scopes, each with requests per minute, tokens per minute and parallel requests:
`key` (all of one key's traffic), `model` (all keys' traffic to one alias) and `key_model` (one
key on one model; `auth.keys[].model_limits` maps alias globs to limits, each matching alias
getting its own bucket).
"""

from __future__ import annotations

import fnmatch
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["requests", "tokens", "parallel"]
LimitScope = Literal["key", "model", "key_model"]
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
    # Derived once, used per request: seconds per unit, and the limit as a header value.
    interval: float = field(init=False, repr=False, compare=False)
    limit_header: bytes = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "interval", WINDOW_S / self.limit)
        object.__setattr__(self, "limit_header", b"%d" % self.limit)

    def scaled(self, divisor: int) -> Rule:
        """This rule with its limit shared among `divisor` replicas (at least 1)."""
        if divisor == 1:
            return self
        limit = max(1, self.limit // divisor)
        return Rule(self.scope, self.kind, limit, self.bucket, self.subject)


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

    @classmethod
    def of(cls, rules: tuple[Rule, ...]) -> RuleSet:
        rules = tuple(sorted(rules, key=lambda r: r.kind == "parallel"))
        tpm = [r.limit for r in rules if r.kind == "tokens"]
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
            slots=tuple((r.bucket, r.limit) for r in rules if not _rate(r)),
            reported=reported,  # type: ignore[arg-type]
        )


def _rate(rule: Rule) -> bool:
    return rule.kind != "parallel"


@dataclass(frozen=True, slots=True)
class KeyLimits:
    limits: Limits
    per_model: tuple[tuple[str, Limits], ...]  # (alias glob, limits), first match wins

    @property
    def limited(self) -> bool:
        return bool(self.limits.items()) or any(lim.items() for _, lim in self.per_model)


class RuleBook:
    """Resolves (key id, model) to its rules once and remembers the answer for configured
    aliases (a bounded set); virtual-key model ids are resolved per request.

    `models` holds every configured alias (Limits() for one without limits of its own)."""

    def __init__(self, keys: Mapping[str, KeyLimits], models: Mapping[str, Limits]) -> None:
        self._keys = keys
        self._models = models
        self._cache: dict[tuple[str, str], RuleSet] = {}

    def rules(self, key_id: str, model: str) -> RuleSet:
        found = self._cache.get((key_id, model))
        if found is None:
            found = RuleSet.of(self._resolve(key_id, model))
            if model in self._models:
                self._cache[(key_id, model)] = found
        return found

    def _resolve(self, key_id: str, model: str) -> tuple[Rule, ...]:
        m = _bucket_name(model)
        out: list[Rule] = []
        key = self._keys.get(key_id)
        if key is not None:
            out += _rules("key", key.limits, f"k:{key_id}", f"key '{key_id}'")
            for glob, limits in key.per_model:
                if fnmatch.fnmatchcase(model, glob):
                    subject = f"model '{model}' on key '{key_id}'"
                    out += _rules("key_model", limits, f"km:{key_id}:{m}", subject)
                    break
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


def _bucket_name(model: str) -> str:
    """Model ids from virtual-key requests are the caller's text: long or odd ones are hashed."""
    if _PLAIN.fullmatch(model):
        return model
    return "h-" + hashlib.sha256(model.encode()).hexdigest()[:24]


@dataclass(slots=True)  # not frozen: built per request, and frozen ones build slowly
class Ask:
    """One admission: every rule that applies, the tokens to reserve, and the lease that holds
    the request's parallel slots."""

    limits: RuleSet
    tokens: int
    lease: str

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
