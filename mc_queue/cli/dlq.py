"""``mcq dlq``: quarantined tasks, one at a time or by fingerprint and age."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from ..contracts.errors import McqError
from ..ops.render import print_task, task_json
from .errors import EXIT_BAD_INPUT, EXIT_REFUSED, fail, handle_errors
from .options import TASK_ID, Ctx, Finite, duration_ms, redis_now_ms
from .output import emit_json
from .root import main


@main.group()
def dlq() -> None:
    """Quarantined tasks: list, show, replay with a reason, purge."""


@dlq.command("list")
@click.option("--by", "by", type=click.Choice(["fingerprint"]), default=None,
              help="Group by the fingerprint of each task's last failure, with counts.")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def dlq_list(obj: Ctx, by: str | None, as_json: bool) -> None:
    if by == "fingerprint":
        _dlq_by_fingerprint(obj, as_json)
        return
    client = obj.reader
    items = {i["task_id"]: i for i in client.reads.attention_items()}
    rows = [{"task_id": t, "quarantined_at_ms": at, "why": items.get(t, {}).get("why_unsafe"),
             "summary": items.get(t, {}).get("summary")} for t, at in client.reads.dlq()]
    if as_json:
        emit_json(rows)
        return
    from ..ops.render import print_dlq

    print_dlq(rows, again=obj.again)


@dlq.command("show")
@click.argument("task_id", type=TASK_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def dlq_show(obj: Ctx, task_id: str, as_json: bool) -> None:
    task = obj.reader.reads.get_task(task_id)
    item = next((i for i in obj.reader.reads.attention_items() if i.get("task_id") == task_id), None)
    if as_json:
        emit_json({**task_json(task), "attention": item})
        return
    print_task(task)
    if item:
        from ..ops.render import print_attention

        print_attention([item])


@dlq.command("replay")
@click.argument("task_id", required=False, type=TASK_ID)
@click.option("--fingerprint", default=None,
              help="Instead of TASK_ID: every quarantined task whose last failure has this fingerprint.")
@click.option("--reason", required=True, help="Why it may run again (at least ten characters).")
@click.option("--hypothesis", default=None, help="What is different now.")
@click.pass_obj
@handle_errors
def dlq_replay(obj: Ctx, task_id: str | None, fingerprint: str | None, reason: str, hypothesis: str | None) -> None:
    if len(reason.strip()) < 10:
        raise click.BadParameter("a replay needs a reason of at least ten characters", param_hint="--reason")
    if (task_id is None) == (fingerprint is None):
        raise click.BadParameter("give either TASK_ID or --fingerprint", param_hint="TASK_ID / --fingerprint")
    if fingerprint is not None:
        _dlq_replay_fingerprint(obj, fingerprint, reason, hypothesis)
        return
    assert task_id is not None
    attempt = obj.client.operator.dlq_replay(task_id, reason, hypothesis, actor="operator")
    click.echo(f"{attempt.id} pending (the sweeper dispatches it)")


@dlq.command("purge")
@click.argument("task_id", required=False, type=TASK_ID)
@click.option("--older-than", default=None, metavar="DUR",
              help="Instead of TASK_ID: every task quarantined more than DUR ago (90s, 15m, 2h, 7d).")
@click.option("--reason", required=True, help="Why its history may go (at least ten characters).")
@click.option("--keep-key-for", "keep_days", type=Finite(0, 3650), default=30.0, show_default=True,
              help="Days during which the task id and its producer key stay refused (0: free them at once).")
@click.option("--yes", is_flag=True, help="Confirm: the task and its whole history are deleted.")
@click.pass_obj
@handle_errors
def dlq_purge(obj: Ctx, task_id: str | None, older_than: str | None, reason: str, keep_days: float,
              yes: bool) -> None:
    if (task_id is None) == (older_than is None):
        raise click.BadParameter("give either TASK_ID or --older-than", param_hint="TASK_ID / --older-than")
    if not yes:
        raise click.BadParameter("purging deletes the task and its history for good: add --yes", param_hint="--yes")
    if older_than is not None:
        _dlq_purge_older(obj, older_than, reason, keep_days)
        return
    assert task_id is not None
    n = obj.client.operator.dlq_purge(task_id, reason=reason, actor="operator", keep_key_s=keep_days * 86_400)
    click.echo(f"{task_id} purged ({n} attempt(s)); its id and producer key are refused for {keep_days:g} day(s)")


def _dlq_by_fingerprint(obj: Ctx, as_json: bool) -> None:
    groups = obj.client.reads.dlq_fingerprints()
    rows: list[dict[str, Any]] = [{"fingerprint": fp, "count": len(ids), "task_ids": ids}
                                  for fp, ids in sorted(groups.items(), key=lambda g: (-len(g[1]), g[0]))]
    if as_json:
        emit_json(rows)
        return
    for r in rows:
        click.echo(f"{r['fingerprint'] or '(none)':<16}  {r['count']:>5}  e.g. {r['task_ids'][0]}")


def _dlq_replay_fingerprint(obj: Ctx, fingerprint: str, reason: str, hypothesis: str | None) -> None:
    ids = obj.client.reads.dlq_fingerprints().get(fingerprint, [])
    if not ids:
        fail(f"no quarantined task's last failure has fingerprint {fingerprint!r} (see `mcq dlq list --by "
             "fingerprint`)", EXIT_BAD_INPUT)
    # each replay recorded on its task, as a single replay is
    done = _each(ids,
                 lambda tid: f"{obj.client.operator.dlq_replay(tid, reason, hypothesis, actor='operator').id} pending",
                 "not replayed")
    click.echo(f"replayed {done} of {len(ids)} task(s) with fingerprint {fingerprint}")
    if done < len(ids):
        sys.exit(EXIT_REFUSED)


def _each(ids: list[str], act: Callable[[str], str], refused: str) -> int:
    """Act on each task; a refusal is reported and the others go on. Returns how many succeeded."""
    done = 0
    for tid in ids:
        try:
            click.echo(act(tid))
            done += 1
        except McqError as exc:
            click.echo(f"mcq: {tid}: {refused}: {exc}", err=True)
    return done


def _dlq_purge_older(obj: Ctx, older_than: str, reason: str, keep_days: float) -> None:
    age = duration_ms(older_than, "--older-than")
    assert age is not None
    cutoff = redis_now_ms(obj) - age
    ids = [tid for tid, at in obj.client.reads.dlq() if at <= cutoff]

    def purge(tid: str) -> str:  # recorded (tombstone, namespace log) as a single purge is
        obj.client.operator.dlq_purge(tid, reason=reason, actor="operator", keep_key_s=keep_days * 86_400)
        return f"{tid} purged"

    done = _each(ids, purge, "not purged")
    click.echo(f"purged {done} of {len(ids)} task(s) quarantined more than {older_than} ago")
    if done < len(ids):
        sys.exit(EXIT_REFUSED)
