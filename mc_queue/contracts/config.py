"""Configuration frozen into a task at enqueue, and the decision that follows a failure.

Validated when built (never when serialized): a RetryPolicy says what each failure class may do and
how retries are paced; a Budget bounds attempts, time, cost, tokens, repeats of one failure and
human interruptions. A :class:`Decision` is what the policy concluded; the scripts apply it in the
same step as the failure it follows.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import tenacity
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .models import FailureClass

Action = Literal["retry", "retry_if_new_hypothesis", "stop", "quarantine"]


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Backoff(_Config):
    """Exponential backoff with full jitter: delay ~ U(0, min(max_s, base_s * 2^(n-1)))."""

    base_s: float = Field(default=1.0, gt=0)
    max_s: float = Field(default=300.0, gt=0)

    def delay(self, failures_so_far: int, retry_after: float | None = None) -> float:
        """Seconds to wait before the next Attempt; a provider's Retry-After is a floor."""
        wait = tenacity.wait_random_exponential(multiplier=self.base_s, max=self.max_s)
        state = tenacity.RetryCallState(retry_object=tenacity.Retrying(), fn=None, args=(), kwargs={})
        state.attempt_number = max(1, failures_so_far)
        jittered = float(wait(state))
        if retry_after is not None:
            return min(max(jittered, retry_after), max(self.max_s, retry_after))
        return jittered

    def upper_bound(self, failures_so_far: int) -> float:
        return min(self.max_s, self.base_s * math.pow(2, max(1, failures_so_far) - 1))


DEFAULT_ACTIONS: dict[FailureClass, Action] = {
    FailureClass.AUTHORIZATION: "stop",
    FailureClass.CONFIGURATION: "stop",
    FailureClass.CAPACITY: "retry",
    FailureClass.PROVIDER: "retry",
    FailureClass.EXECUTOR: "retry",  # only after reconciliation (the sweeper's path settles first)
    FailureClass.VALIDATION: "retry_if_new_hypothesis",
    FailureClass.REPOSITORY: "retry_if_new_hypothesis",
    FailureClass.INTERNAL: "quarantine",
}


class RetryPolicy(_Config):
    """What each failure class may do, and how retries are paced. Validated when built."""

    version: str = "default-v1"
    actions: dict[FailureClass, Action] = Field(default_factory=lambda: dict(DEFAULT_ACTIONS))
    backoff: Backoff = Field(default_factory=Backoff)

    @model_validator(mode="after")
    def _complete(self) -> RetryPolicy:
        missing = set(FailureClass) - set(self.actions)
        if missing:
            merged = dict(DEFAULT_ACTIONS)
            merged.update(self.actions)
            object.__setattr__(self, "actions", merged)
        return self


class Budget(_Config):
    """Per-task limits; exhausting any one stops the task with an attention item."""

    max_attempts: int = Field(default=5, ge=1)
    max_wall_s: float | None = Field(default=None, gt=0)
    max_cost: float | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, ge=0)
    max_same_fingerprint: int = Field(default=3, ge=1)
    max_interruptions: int = Field(default=3, ge=0)


class Retention(_Config):
    """How long a queue's tasks stay in Redis once they ended (the sweeper deletes the rest, in batches,
    after handing each to the archive when one is set). ``None`` keeps them.

    - finished (succeeded, canceled): ``done_s`` seconds after they finished and/or the newest ``done_keep``;
    - waiting for a person (failed, blocked, quarantined): ``held_s`` and/or ``held_keep``, longer by default;
    - ``tombstone_s``: after a task is deleted, enqueue refuses its id and producer key for this long (the
      idempotency window: the same work does not run twice), then forgets them.
    """

    done_s: float | None = Field(default=7 * 86_400.0, gt=0, le=3650 * 86_400)
    done_keep: int | None = Field(default=None, ge=0, le=10**9)
    held_s: float | None = Field(default=90 * 86_400.0, gt=0, le=3650 * 86_400)
    held_keep: int | None = Field(default=None, ge=0, le=10**9)
    tombstone_s: float = Field(default=86_400.0, ge=0, le=3650 * 86_400)


# --------------------------------------------------------------------------- decisions


@dataclass(frozen=True)
class Decision:
    action: Literal["retry", "stop", "quarantine"]
    why: str
    delay_s: float = 0.0
    next_reason: str = ""
    next_hypothesis: str = ""
    attention: dict[str, Any] = field(default_factory=dict)
    budget_exhausted: str = ""

    @property
    def task_state(self) -> str:
        return {"retry": "backoff", "stop": "blocked", "quarantine": "quarantined"}[self.action]



def parse_config(value: str | Mapping[str, Any] | None, model: type[_Config]) -> Any:
    if not value:
        return model()
    if isinstance(value, str):
        return model.model_validate_json(value)
    return model.model_validate(dict(value))
