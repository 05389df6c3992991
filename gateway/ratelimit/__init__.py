"""Rate limits per key, per model alias and per key and model: requests and tokens per minute
(GCRA) and parallel requests, kept in this process (`memory`) or shared through Redis."""

from gateway.ratelimit.limiter import Grant, Limiter, Observer, no_grant
from gateway.ratelimit.rules import (
    BreakerConfig,
    KeyLimits,
    Limits,
    RateLimitConfig,
    RuleBook,
    TeamLimits,
)

__all__ = [
    "BreakerConfig",
    "Grant",
    "KeyLimits",
    "Limiter",
    "Limits",
    "Observer",
    "RateLimitConfig",
    "RuleBook",
    "TeamLimits",
    "no_grant",
]
