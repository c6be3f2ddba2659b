"""Reconciliation: a suspect Attempt is settled from persisted state and provider truth alone.

For every effect with an intent and no receipt, the provider is asked (``operations`` maps an
operation name to its reconcile): found -> the receipt is recorded; absent -> safe to redo;
unknown (no reconcile registered, or it raised) -> cannot tell. Then one decision, with its evidence:

- an effect is unknown: the task is blocked with an attention item (never a blind requeue);
- a cancel was requested: the Attempt and the task end canceled, the effects found kept as evidence;
- the result was on file (``result_pending``) and every effect is proven: succeeded;
- otherwise: failed, executor class. Without ``apply_policy`` the task waits for a person; with it,
  the retry policy and budget frozen in the task decide (the sweeper's way). A next Attempt replays
  the recorded receipts instead of repeating those effects.

Re-entrant: a reconciler that died mid-way leaves the Attempt reconciling, and the next one picks it up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ..client import Client
from ..contracts.config import Decision
from ..contracts.failures import make_failure
from ..contracts.keys import parse_attempt_id
from ..contracts.models import Attempt, EffectRecord, FailureClass
from .classify import Classified, decision_for

Operations = Mapping[str, Callable[[str], Any]]


class Reconciler:
    """Settles suspect Attempts of one namespace, asking providers through ``operations``."""

    def __init__(self, client: Client, operations: Operations | None = None, *, actor: str | None = None) -> None:
        self.client = client
        self.operations: Operations = dict(operations or {})
        self.actor = actor or client.actor

    def reconcile(self, attempt_id: str, *, apply_policy: bool = False, actor: str | None = None) -> Attempt:
        """suspect -> reconciling -> settled (see the module's docstring for the decision)."""
        c = self.client
        who = actor or self.actor
        c.operator.begin_reconcile(attempt_id, actor=who)
        task_id, n = parse_attempt_id(attempt_id)
        findings: list[dict[str, Any]] = []
        for key, rec in c.reads.effects(task_id).items():
            if rec.state == "intent":
                outcome, value = self._ask_provider(key, rec)
                rec = c.leases.effect_done(attempt_id, None, key, outcome, value, source="reconcile", actor=who)
            findings.append({"key": key, "operation": rec.operation, "state": rec.state, "receipt": rec.receipt,
                             "note": rec.note, "by_attempt": rec.receipt_attempt or rec.attempt})
        task = c.reads.get_task(task_id)
        attempt = task.attempts[n - 1]
        pending = attempt.checkpoints.get("result_pending")
        unknown = [f["key"] for f in findings if f["state"] == "unknown"]
        mine_absent = [f["key"] for f in findings if f["state"] == "absent" and f["by_attempt"] == n]
        evidence: dict[str, Any] = {"effects": findings, "result_pending": pending is not None}
        if task.cancel_requested:
            evidence["conclusion"] = f"canceled ({task.cancel_requested}); effects found are kept as evidence"
            return c.operator.settle_attempt(attempt_id, who, "canceled", evidence=evidence)
        phase = attempt.phase or "start"
        failure = make_failure(FailureClass.EXECUTOR, "LeaseLost",
                               f"the worker's lease expired in phase {phase} before it completed")
        if unknown:
            evidence["conclusion"] = f"cannot tell whether {', '.join(unknown)} happened: a person must look"
            why = "an effect's outcome is unknown at the provider; another attempt could duplicate it"
            stop = Decision("stop", why, attention={
                "task_id": task_id, "kind": "unknown_effect", "summary": f"{task.handler} on {task_id}: {why}",
                "tried": [{"attempt": a.number, "state": a.state.value, "hypothesis": a.hypothesis}
                          for a in task.attempts],
                "changed": [], "why_unsafe": why, "effects": findings, "failure_class": "executor"})
            return c.operator.settle_attempt(attempt_id, who, "failed", failure=failure, evidence=evidence,
                                             decision=stop)
        if pending is not None and not mine_absent:
            result = (pending.get("data") or {}).get("result")
            evidence["conclusion"] = "the result was on file before the worker vanished and every effect is proven"
            return c.operator.settle_attempt(attempt_id, who, "succeeded", result=result, evidence=evidence)
        evidence["conclusion"] = (f"failed (executor): the worker vanished in phase {phase}; "
                                  f"{sum(1 for f in findings if f['state'] == 'done')} effect(s) proven done will be "
                                  "replayed from their receipts, not repeated")
        decision = decision_for(task, attempt, Classified(failure)) if apply_policy else None
        return c.operator.settle_attempt(attempt_id, who, "failed", failure=failure, evidence=evidence,
                                         decision=decision)

    def _ask_provider(self, key: str, rec: EffectRecord) -> tuple[str, Any]:
        ask = self.operations.get(rec.operation)
        if ask is None:
            return "unknown", f"no reconcile registered for operation {rec.operation!r}"
        try:
            found = ask(key)
        except Exception as exc:
            return "unknown", f"{type(exc).__name__}: {exc}"[:500]
        return ("done", found) if found is not None else ("absent", "the provider has no trace of it")


def reconcile_attempt(client: Client, attempt_id: str, *, actor: str | None = None, apply_policy: bool = False,
                      operations: Operations | None = None) -> Attempt:
    """Reconcile one suspect Attempt (see :class:`Reconciler`)."""
    return Reconciler(client, operations, actor=actor).reconcile(attempt_id, apply_policy=apply_policy)
