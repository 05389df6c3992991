"""Mirostat v2, llama.cpp's version, as a per-sequence logits callable, without vLLM.

Importing this module imports neither vLLM nor torch: the gateway calls `validate` while it
checks a request. The engine side (`mirostat_lp.MirostatLP`) hands each sequence its own
`MirostatState`, which vLLM calls once per step as `state(output_ids, logits_row)`.

Per step, for a sequence with target τ (bits) and learning rate η:
1. μ ← μ - η·(s - τ), where s is the surprise of the token sampled at the previous step. The
   callable runs before sampling, so it learns that token only now, from `output_ids[-1]`.
2. Keep the tokens whose surprise -log2 p is at most μ (at least the most probable one) and
   set every other logit to -inf; the sampler then samples from the renormalised survivors.

s is measured on the renormalised truncated distribution the token was sampled from (llama.cpp's
choice; the authors' reference code used the untruncated one), so the state keeps the survivors'
renormalised surprises for one step.

Where the logits come from: `MirostatLP` is argmax-invariant, so vLLM applies it inside the
sampler after penalties, temperature and min_p and before top-k/top-p (llama.cpp's chain also
runs temperature before Mirostat). Temperature therefore reshapes the distribution that Mirostat
truncates; with top-k/top-p also set, the sampler narrows the survivors further, and the observed
surprise can stay below τ. A greedy row (temperature 0) takes the argmax, which truncation always
keeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

TARGET_KEY = "mirostat_target"
LR_KEY = "mirostat_lr"
EXTRA_ARGS_KEYS = (TARGET_KEY, LR_KEY)
DEFAULT_LR = 0.1  # llama.cpp's default η
BITS_PER_NAT = 1.0 / math.log(2.0)
# The engine argument `logits_processors=[LOGITS_PROCESSOR]` loads it (no vLLM import needed here).
LOGITS_PROCESSOR = "providers.vllm_engine.mirostat_lp:MirostatLP"


class MirostatError(ValueError):
    """A bad Mirostat setting; `param` names the request field. A ValueError, so that vLLM's
    `validate_params` hook turns it into a VLLMValidationError."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def validate(target: object, lr: object = DEFAULT_LR) -> tuple[float, float]:
    """(τ, η) as floats; MirostatError naming the parameter unless both are finite numbers > 0."""
    return _positive_number(TARGET_KEY, target), _positive_number(LR_KEY, lr)


def _positive_number(name: str, value: object) -> float:
    # bool is an int subclass, but `true` is not a number a client meant to send.
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise MirostatError(name, f"'{name}' must be a number greater than 0, got {value!r}.")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        number = math.inf
    if not (0.0 < number < math.inf):  # also rejects NaN
        raise MirostatError(
            name, f"'{name}' must be a finite number greater than 0, got {value!r}."
        )
    return number


def from_extra_args(extra_args: Mapping[str, Any] | None) -> tuple[float, float] | None:
    """(τ, η) from `SamplingParams.extra_args`, or None when Mirostat is off (no target, or a
    null one). η defaults to DEFAULT_LR; MirostatError for bad values or η without τ."""
    args = extra_args or {}
    target, lr = args.get(TARGET_KEY), args.get(LR_KEY)
    if target is None:
        if lr is not None:
            raise MirostatError(
                LR_KEY, f"'{LR_KEY}' needs '{TARGET_KEY}' (Mirostat is on only with a target)."
            )
        return None
    return validate(target, DEFAULT_LR if lr is None else lr)


def surprises(logits: torch.Tensor) -> torch.Tensor:
    """-log2 p of every token under softmax(logits), in bits."""
    return -logits.log_softmax(dim=-1) * BITS_PER_NAT


def keep_mask(surprise: torch.Tensor, mu: float) -> torch.Tensor:
    """Tokens with surprise ≤ μ; when none qualifies, the most probable one(s). Raising the bar
    to the smallest surprise keeps ties for the top together, so the argmax always survives."""
    return surprise <= max(mu, float(surprise.min()))


def update_mu(mu: float, surprise: float, target: float, lr: float) -> float:
    """A surprise above τ lowers μ (tighter truncation next step); one below τ raises it."""
    return mu - lr * (surprise - target)


class MirostatState:
    """One sequence's Mirostat v2 state; callable as vLLM's per-request logits processor.

    vLLM does not say which calls led to a kept token: a partial-prefill step samples a token it
    then discards. So μ is updated only when exactly one token was appended since the previous
    call, and only from the distribution that call produced. When vLLM drops a request from its
    batch and adds it back (preemption, or a step that did not schedule it), it builds a new
    state: μ restarts at 2τ, as at the start of a sequence.
    """

    def __init__(self, target: float, lr: float) -> None:
        self.target = target
        self.lr = lr
        self.mu = 2.0 * target  # μ = 2τ at each sequence's start, llama.cpp's reset value
        self.last_surprise: float | None = None  # s of the latest observed token, for tests/logs
        self._seen = 0  # len(output_ids) at the previous call
        # The previous call's survivors and their renormalised surprises (bits).
        self._kept_ids: torch.Tensor | None = None
        self._kept_surprise: torch.Tensor | None = None

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        self.observe(output_ids)
        return self.truncate(logits)

    def observe(self, output_ids: Sequence[int]) -> None:
        """Update μ from the surprise of the token the previous step sampled, if it is known."""
        appended_one = len(output_ids) == self._seen + 1
        self._seen = len(output_ids)
        if not appended_one:
            return
        surprise = self._previous_surprise(output_ids[-1])
        if surprise is not None:
            self.last_surprise = surprise
            self.mu = update_mu(self.mu, surprise, self.target, self.lr)

    def _previous_surprise(self, token: int) -> float | None:
        if self._kept_ids is None or self._kept_surprise is None:
            return None
        hit = self._kept_surprise[self._kept_ids == token]
        # Not a survivor: something after Mirostat overrode it; there is nothing to learn from.
        return float(hit[0]) if hit.numel() else None

    def truncate(self, logits: torch.Tensor) -> torch.Tensor:
        """Set the logits of the tokens Mirostat drops to -inf, in place; returns `logits`."""
        self._kept_ids = self._kept_surprise = None
        if not math.isfinite(float(logits.max())):
            return logits  # no usable distribution (all -inf, +inf or NaN): leave it to vLLM
        keep = keep_mask(surprises(logits), self.mu)
        logits.masked_fill_(~keep, -math.inf)
        self._kept_ids = keep.nonzero().squeeze(-1)
        self._kept_surprise = surprises(logits[self._kept_ids])
        return logits
