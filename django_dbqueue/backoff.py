"""Retry schedules: pure functions, no Django import.

The default is capped exponential backoff with *full jitter*: the delay before retry ``n`` is drawn
uniformly from ``[0, min(cap, base * factor ** (n - 1))]``. Full jitter spreads a burst of failures
(a provider outage that fails a thousand jobs in the same second) over the whole window instead of
retrying them in lock-step, which is what keeps a recovering provider from being knocked over again.
"""

import random
from dataclasses import dataclass


def ceiling(attempt, *, base, factor, cap):
    """The upper bound of the delay after failed attempt ``attempt`` (1-based), in seconds."""
    if attempt < 1:
        raise ValueError(f"attempt must be >= 1, got {attempt!r}")
    if factor == 1 or base >= cap:
        return float(min(base, cap))
    # Multiply step by step and stop at the cap, so a huge attempt number cannot overflow.
    bound = base
    for _ in range(attempt - 1):
        bound *= factor
        if bound >= cap:
            return float(cap)
    return float(min(bound, cap))


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with full jitter. Callable: ``Backoff()(attempt) -> seconds``.

    ``base``: ceiling after the first failure, seconds. ``factor``: growth per attempt.
    ``cap``: the largest ceiling, seconds. ``jitter``: False gives the ceiling itself (tests, demos).
    """

    base: float = 2.0
    factor: float = 2.0
    cap: float = 3600.0
    jitter: bool = True

    def __post_init__(self):
        for name in ("base", "factor", "cap"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"Backoff.{name} must be a number, got {value!r}")
        if self.base <= 0:
            raise ValueError(f"Backoff.base must be > 0 seconds, got {self.base!r}")
        if self.factor < 1:
            raise ValueError(f"Backoff.factor must be >= 1, got {self.factor!r}")
        if self.cap < self.base:
            raise ValueError(f"Backoff.cap ({self.cap!r}) must be >= base ({self.base!r})")

    def ceiling(self, attempt):
        return ceiling(attempt, base=self.base, factor=self.factor, cap=self.cap)

    def __call__(self, attempt, rng=random.random):
        bound = self.ceiling(attempt)
        return bound * rng() if self.jitter else bound


def constant(seconds):
    """A schedule that always waits ``seconds`` (no jitter)."""
    if seconds < 0:
        raise ValueError(f"constant backoff must be >= 0 seconds, got {seconds!r}")

    def schedule(attempt, rng=None):
        return float(seconds)

    return schedule
