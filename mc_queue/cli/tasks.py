"""``mcq enqueue``, ``show``, ``retry``, ``cancel``, ``attention`` and ``tasks``: one task at a time, or
found through the indexes."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import click

from ..ops.render import print_task, task_json
from .errors import handle_errors
from .options import TASK_ID, Ctx, Finite, check_reason, duration_ms, load_app, redis_now_ms
from .output import emit_json
from .root import main


@main.command()
@click.argument("handler")
@click.option("--app", "app_spec", envvar="MCQ_APP", required=True,
              help="The handlers' App, as package.module:app (or $MCQ_APP). The task goes through the same path "
                   "as app.connect().enqueue: an unknown handler is refused, the handler's queue, retry policy, "
                   "budget, lease and timeout are frozen into the task, and its RQ job gets the handler's timeout.")
@click.option("--payload", required=True, help="The task's payload: a JSON object.")
@click.option("--queue", default=None, help="Another queue than the handler's own.")
@click.option("--idempotency-key", default=None, help="Producer key: the same key returns the same task.")
@click.option("--delay", default=None, metavar="DUR",
              help="Run no sooner than DUR from now (90s, 15m, 2h, 7d), on Redis's clock: the task is scheduled "
                   "until then and no worker is sent it before.")
@click.option("--at", "run_at", default=None, metavar="TIME",
              help="Run no sooner than TIME, an ISO 8601 time with its zone (2026-12-24T02:00:00+00:00, or ...Z).")
@click.option("--priority", type=click.IntRange(1, 9), default=None,
              help="1 (most urgent) to 9; 5 by default. Workers take the more urgent first.")
@click.option("--start-by", default=None, metavar="DUR|TIME",
              help="Deadline: if no worker started it within DUR (on Redis's clock) or by TIME, it is canceled with "
                   "the deadline as its reason, never started late.")
@click.option("--finish-by", default=None, metavar="DUR|TIME",
              help="Deadline: if it has not ended within DUR or by TIME, it is canceled (a running Attempt is "
                   "signalled, then reconciled).")
@click.option("--after", "after", multiple=True, metavar="TASK",
              help="Wait for this task to end first (repeatable): the task is waiting until each has ended, then "
                   "pending; see --after-mode.")
@click.option("--after-mode", type=click.Choice(["succeeded", "ended"]), default="succeeded", show_default=True,
              help="succeeded: each task of --after must succeed, and one that ends otherwise cancels this one; "
                   "ended: any end counts.")
@click.option("--json", "as_json", is_flag=True, help="Print the whole task as JSON.")
@click.pass_obj
@handle_errors
def enqueue(obj: Ctx, handler: str, app_spec: str, payload: str, queue: str | None, idempotency_key: str | None,
            delay: str | None, run_at: str | None, priority: int | None, start_by: str | None,
            finish_by: str | None, after: tuple[str, ...], after_mode: str, as_json: bool) -> None:
    """Create a task of an App's handler and hand it to the workers; prints its id."""
    from ..producer.dispatch import AppClient

    delay_ms = duration_ms(delay, "--delay")
    at = _time_option(run_at, "--at")
    deadlines = {"start_by": _deadline_option(start_by, "--start-by"),
                 "finish_by": _deadline_option(finish_by, "--finish-by")}

    try:
        data = json.loads(payload)
    except RecursionError:
        raise click.BadParameter("the JSON is nested too deeply; flatten it", param_hint="--payload") from None
    except ValueError as exc:
        raise click.BadParameter(f"not valid JSON ({exc}); e.g. --payload '{{\"repo\": \"x\"}}'",
                                 param_hint="--payload") from None
    producer = AppClient(load_app(app_spec), obj.client)
    try:
        task = producer.enqueue(handler, data, idempotency_key=idempotency_key, queue=queue,
                                delay_s=None if delay_ms is None else delay_ms / 1000, run_at=at,
                                priority=priority, **{k: v for k, v in deadlines.items() if v is not None},
                                **({"after": list(after), "after_mode": after_mode} if after else {}))
    finally:
        producer.close()
    if as_json:
        emit_json(task_json(task))
    else:
        click.echo(task.id)  # stdout: the id alone, for scripts (TASK=$(mcq enqueue ...))
        click.echo(f"follow it: {obj.again} show {task.id}  (all tasks: {obj.again} tasks)", err=True)


def _time_option(text: str | None, hint: str) -> datetime | None:
    """An ISO 8601 time with its zone, or None."""
    if text is None:
        return None
    try:
        at = datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text[:40]!r} is not an ISO 8601 time; e.g. {hint} 2026-12-24T02:00:00Z",
                                 param_hint=hint) from None
    if at.tzinfo is None:
        raise click.BadParameter(f"{text!r} has no time zone; add one, e.g. {text}Z or {text}+01:00", param_hint=hint)
    return at


def _deadline_option(text: str | None, hint: str) -> datetime | timedelta | None:
    """A duration from now (90s, 15m, 2h) or an ISO 8601 time with its zone, or None."""
    if text is None:
        return None
    if text[:1].isdigit() and text[-1:] in "smhd" and not any(c in text for c in "-:T"):
        ms = duration_ms(text, hint)
        if not ms or ms <= 0:
            raise click.BadParameter("must be more than 0", param_hint=hint)
        return timedelta(milliseconds=ms)
    return _time_option(text, hint)


EXIT_NOT_SUCCEEDED, EXIT_TIMED_OUT = 7, 8  # `mcq wait`: a task ended otherwise; the timeout passed


@main.command()
@click.argument("task_ids", nargs=-1, required=True, type=TASK_ID)
@click.option("--timeout", "timeout", required=True, metavar="DUR",
              help="Give up after DUR (90s, 15m, 2h; required: a wait never hangs).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON: task id -> state, result, reason.")
@click.pass_obj
@handle_errors
def wait(obj: Ctx, task_ids: tuple[str, ...], timeout: str, as_json: bool) -> None:
    """Wait until each task ended; print its state and result or why it ended.

    Exit 0 when every task succeeded, 7 when one ended otherwise (canceled, failed, blocked,
    quarantined, purged), 8 when the timeout passed first (stderr says where each task was), 2 for
    a task that does not exist. A task that ended before the call returns at once.
    """
    from ..client.results import WaitTimedOut

    timeout_ms = duration_ms(timeout, "--timeout") or 0
    if timeout_ms <= 0:
        raise click.BadParameter("must be more than 0", param_hint="--timeout")
    try:
        outcomes = obj.reader.results.wait_many(list(task_ids), timeout_s=timeout_ms / 1000)
    except WaitTimedOut as exc:
        click.echo(f"mcq: {exc}", err=True)
        raise SystemExit(EXIT_TIMED_OUT) from None
    if as_json:
        emit_json({tid: {"state": o.state, "result": o.result, "reason": o.reason} for tid, o in outcomes.items()})
    for tid, o in outcomes.items() if not as_json else ():
        click.echo(f"{tid} {o.state}: {o.reason}" + (f"; result {json.dumps(o.result)}" if o.succeeded else ""))
    if not all(o.succeeded for o in outcomes.values()):
        raise SystemExit(EXIT_NOT_SUCCEEDED)


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def show(obj: Ctx, task_id: str, as_json: bool) -> None:
    """A task, its Attempts and its whole timeline."""
    task = obj.reader.reads.get_task(task_id)
    effects = obj.reader.reads.effects(task_id)
    if as_json:
        emit_json(task_json(task, effects))
    else:
        print_task(task, effects=effects)


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--reason", required=True, help="Why another Attempt (at least ten characters).")
@click.option("--hypothesis", default=None, help="What is different this time.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def retry(obj: Ctx, task_id: str, reason: str, hypothesis: str | None, as_json: bool) -> None:
    """Append Attempt N+1 to a failed task (Mission Control's rules)."""
    if len(reason.strip()) < 10:
        raise click.BadParameter("a retry needs a reason of at least ten characters", param_hint="--reason")
    attempt = obj.client.operator.retry_task(task_id, reason, hypothesis, actor="operator")
    if as_json:
        emit_json(attempt.model_dump(mode="json"))
    else:
        click.echo(attempt.id)


@main.command()
@click.argument("task_id", type=TASK_ID)
@click.option("--reason", required=True, help="Why (at least ten characters); recorded.")
@click.option("--ack-timeout", type=Finite(0, 86_400), default=30.0, show_default=True,
              help="Seconds (0 to 86400) the executor has to acknowledge before its lease is voided.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def cancel(obj: Ctx, task_id: str, reason: str, ack_timeout: float, as_json: bool) -> None:
    """Cancel a task: prevent new work, signal the executor, reconcile, terminate as canceled."""
    if len(reason.strip()) < 10:
        raise click.BadParameter("a cancellation needs a reason of at least ten characters", param_hint="--reason")
    outcome = obj.client.operator.cancel_task(task_id, reason, actor="operator", ack_timeout_ms=int(ack_timeout * 1000))
    if as_json:
        emit_json({"task_id": task_id, "outcome": outcome})
    else:
        click.echo(f"{task_id}: {outcome}" + (" (the executor is told at its next heartbeat; the sweeper "
                                             "finishes the protocol)" if outcome == "signaled" else ""))


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def attention(obj: Ctx, as_json: bool) -> None:
    """Tasks stopped for a person: what was tried, what changed, why another Attempt is unsafe."""
    items = obj.reader.reads.attention_items()
    if as_json:
        emit_json(items)
        return
    from ..ops.render import print_attention

    print_attention(items, quarantined={task_id for task_id, _ in obj.reader.reads.dlq()})


@main.group(invoke_without_command=True)
@click.option("--queue", "queue_name", default=None, help="Only this queue.")
@click.option("--state", "states", multiple=True,
              type=click.Choice(["scheduled", "waiting", "pending", "backoff", "running", "succeeded", "canceled",
                                 "failed", "blocked", "quarantined"]),
              help="Only tasks in this state (repeatable), from the indexes: scheduled, waiting, pending, backoff (the "
                   "queues' pending indexes), running (lease and suspect indexes), succeeded, canceled (the queues' "
                   "done indexes, newest first), failed, blocked, quarantined (the queues' held indexes).")
@click.option("--handler", default=None, help="Only tasks of this handler.")
@click.option("--priority", type=click.IntRange(1, 9), default=None, help="Only tasks of this priority (5: none set).")
@click.option("--schedule", "schedule_name", default=None, help="Only tasks this periodic schedule made.")
@click.option("--older-than", default=None, metavar="DUR", help="Created more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--since", default=None, metavar="DUR", help="Created within the last DUR.")
@click.option("--limit", type=click.IntRange(1, 10_000), default=50, show_default=True,
              help="Rows at most; at most 10 x LIMIT index entries are looked at.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_context
@handle_errors
def tasks(ctx: click.Context, queue_name: str | None, states: tuple[str, ...], handler: str | None,
          priority: int | None, schedule_name: str | None, older_than: str | None, since: str | None, limit: int,
          as_json: bool) -> None:
    """Tasks found through the indexes (no scan of the keyspace); `mcq tasks purge` deletes ended ones."""
    if ctx.invoked_subcommand is not None:
        return
    obj: Ctx = ctx.obj
    client = obj.reader  # (before redis_now_ms: a read never starts the embedded server)
    now = redis_now_ms(obj)
    older = duration_ms(older_than, "--older-than")
    newer = duration_ms(since, "--since")
    rows, truncated = client.reads.list_tasks(
        queue=queue_name, states=list(states) or None, handler=handler, limit=limit, priority=priority,
        schedule=schedule_name, created_before_ms=None if older is None else now - older,
        created_after_ms=None if newer is None else now - newer)
    if as_json:
        emit_json({"tasks": rows, "truncated": truncated})
        return
    for r in rows:
        age_s = max(0, now - r["created_at_ms"]) / 1000
        click.echo(f"{r['task_id']}  {r['state']:<11} {r['handler']:<24} attempts {r['attempts']:<3} "
                   f"age {age_s:.0f}s" + (f"  priority {r['priority']}" if r["priority"] != 5 else ""))
    if truncated:
        click.echo(f"(the first {10 * limit} index entries looked at: more may match; narrow the filters)", err=True)


@tasks.command("purge")
@click.option("--queue", "queue_name", required=True, help="The queue whose ended tasks go.")
@click.option("--state", "states", multiple=True, required=True,
              type=click.Choice(["succeeded", "canceled", "failed", "blocked", "quarantined"]),
              help="Only tasks in this state (repeatable); never one with an Attempt that may still run.")
@click.option("--older-than", required=True, metavar="DUR", help="Ended more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--reason", required=True, help="Why their history may go (at least ten characters), recorded.")
@click.option("--keep-key-for", "keep_days", type=Finite(0, 3650), default=1.0, show_default=True,
              help="Days during which each task id and producer key stay refused by enqueue.")
@click.option("--archive", "archive_dir", default=None, metavar="DIR",
              help="Write each task to this archive folder (gzip JSON lines) before deleting it.")
@click.option("--limit", type=click.IntRange(1, 1_000_000), default=10_000, show_default=True,
              help="Tasks deleted at most by this command.")
@click.option("--yes", is_flag=True, help="Confirm: the tasks and their whole history leave Redis.")
@click.pass_obj
@handle_errors
def tasks_purge(obj: Ctx, queue_name: str, states: tuple[str, ...], older_than: str, reason: str, keep_days: float,
                archive_dir: str | None, limit: int, yes: bool) -> None:
    """Delete a queue's ended tasks older than DUR, each with every key and index entry (a tombstone stays)."""
    from ..ops.archive import FileArchive, archive_and_retire

    check_reason(reason)
    if not yes:
        raise click.BadParameter("purging deletes the tasks and their history for good: add --yes",
                                 param_hint="--yes")
    age = duration_ms(older_than, "--older-than")
    assert age is not None
    c = obj.client
    archive = FileArchive(archive_dir) if archive_dir else None
    cutoff = redis_now_ms(obj) - age
    done = 0
    kinds = [k for k, members in (("done", {"succeeded", "canceled"}), ("held", {"failed", "blocked", "quarantined"}))
             if members & set(states)]
    for kind in kinds:
        skipped: set[str] = set()
        while done < limit:
            rows = [r for r in c.maintenance.ended_tasks(queue_name, kind, before_ms=cutoff, limit=min(500,
                                                                                                       limit - done)
                                             + len(skipped)) if r[0] not in skipped]
            if not rows:
                break
            now_states = c.reads.task_states([t for t, _ in rows])
            wanted = [(t, sc) for t, sc in rows if now_states.get(t) in states]
            skipped.update(t for t, _ in rows)
            if not wanted:
                if len(rows) < 500:
                    break
                continue
            # Archived first (when asked), and deleted only as archived: an archive that fails deletes nothing.
            out = archive_and_retire(c, archive, wanted, states=states, reason=reason, tombstone_s=keep_days * 86_400,
                                     now_ms=redis_now_ms(obj), actor="operator", log_each=True)
            done += out["retired"]
    click.echo(f"{done} task(s) of queue {queue_name} purged ({', '.join(states)}, ended more than {older_than} "
               f"ago){'; archived in ' + archive_dir if archive_dir else ''}")
