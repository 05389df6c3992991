"""Routing trees: what a model alias (or a Portkey config) routes to.

A tree's leaves are targets, each with its effective retry policy, timeouts and parameter
overrides (inherited from its groups when the config was read: a child's own value wins). A
group tries its children as its mode says:

* `single`: its first child;
* `fallback`: each child in turn until one answers, moving on after a failure it falls back on
  (a listed status; always after a timeout, a lost connection or an open circuit);
* `loadbalance`: one child, picked by weight among those whose circuits are not open.

`path` names a node as Portkey's `x-portkey-last-used-option-index` does (`config.targets[1]`),
or by its YAML path for a model alias.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from core.errors import CircuitOpen, GatewayError, UpstreamTimeout, UpstreamUnreachable
from core.provider import Target
from gateway.routing.retry import RetryPolicy

MODES = ("single", "fallback", "loadbalance")
# The upstream answers that mean "this target, not this request": worth the next target.
FALLBACK_STATUSES = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True, slots=True)
class Leaf:
    provider: str
    model: str | None  # None: the request's model (a Portkey target without a model override)
    path: str
    weight: float = 1.0
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    target: Target | None = None  # a model alias's target, built with the config
    overrides: Mapping[str, Any] = field(default_factory=dict)  # Portkey's override_params
    # Portkey's request_timeout: an attempt up to its answer (a stream: its first output), else
    # a 408 as Portkey fabricates it.
    request_s: float | None = None


@dataclass(frozen=True, slots=True)
class Group:
    mode: str
    children: tuple[Node, ...]
    path: str
    weight: float = 1.0
    # Statuses a fallback moves on after; None: any failure (Portkey's default).
    fall_on: frozenset[int] | None = FALLBACK_STATUSES

    @property
    def weights(self) -> tuple[float, ...]:
        return tuple(child.weight for child in self.children)

    def falls_back(self, err: GatewayError) -> bool:
        if no_answer(err) or self.fall_on is None:
            return True
        return (err.upstream_status or err.status) in self.fall_on


Node = Leaf | Group


def no_answer(err: GatewayError) -> bool:
    """The target gave no answer at all: a timeout, a lost connection, an open circuit."""
    if isinstance(err, CircuitOpen):
        return True
    return isinstance(err, (UpstreamTimeout, UpstreamUnreachable)) and err.upstream_status is None


def leaves(node: Node) -> tuple[Leaf, ...]:
    if isinstance(node, Leaf):
        return (node,)
    return tuple(leaf for child in node.children for leaf in leaves(child))
