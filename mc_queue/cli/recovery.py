"""The namespace and its recovery: ``mcq namespace``, ``recover``, ``expire`` and ``reconcile``."""

from __future__ import annotations

import dataclasses

import click

from .errors import EXIT_BAD_INPUT, fail, handle_errors
from .options import ATTEMPT_ID, Ctx
from .output import emit_json, exit_if_lost
from .root import main


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def expire(obj: Ctx, as_json: bool) -> None:
    """Turn every lease past its expiry into a suspect Attempt (once)."""
    expired = obj.client.maintenance.expire_leases()
    if as_json:
        emit_json([dataclasses.asdict(e) for e in expired])
    else:
        for e in expired:
            click.echo(f"{e.attempt_id} suspect (fence {e.old_fence} -> {e.new_fence})")
        click.echo(f"{len(expired)} lease(s) expired")


@main.command()
@click.argument("attempt_id", type=ATTEMPT_ID)
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def reconcile(obj: Ctx, attempt_id: str, as_json: bool) -> None:
    """Settle a suspect Attempt from the evidence recorded."""
    from ..policy.reconcile import reconcile_attempt

    attempt = reconcile_attempt(obj.client, attempt_id, actor="operator")
    if as_json:
        emit_json(attempt.model_dump(mode="json"))
    else:
        click.echo(f"{attempt.id} {attempt.state.value}")


@main.command()
@click.option("--reason", default="operator ran mcq recover", show_default=True)
@click.option("--yes", is_flag=True,
              help="Confirm a recovery of a namespace that is ok (one that lost state or is recovering needs none).")
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def recover(obj: Ctx, reason: str, yes: bool, as_json: bool) -> None:
    """After Redis lost state: new epoch, fence floor raised, every live lease voided.

    On a namespace that is ok this voids leases that are live and well (their workers' next writes
    are refused, their Attempts turn suspect and are reconciled): it asks for --yes first."""
    from ..policy.recovery import recover as run_recovery

    client = obj.client
    info = client.reads.namespace()
    if info.state == "ok" and not yes:
        live = client.reads.overview()["leases_live"]
        fail(f"namespace {info.prefix!r} is ok: `mcq recover` would retire its epoch {info.epoch}, raise the "
             f"fence floor and void its {live} live lease(s) (their workers' next writes refused, their "
             "Attempts turned suspect and reconciled). Nothing was done; add --yes to recover it anyway",
             EXIT_BAD_INPUT)
    report = run_recovery(client, reason=reason, actor="operator")
    if as_json:
        emit_json(report)
    else:
        click.echo(f"recovered: epoch {report['epoch']}, fence floor {report['fence_floor']}, "
                   f"{len(report['voided_leases'])} lease(s) voided (now suspect)")


@main.command()
@click.option("--json", "as_json", is_flag=True)
@click.pass_obj
@handle_errors
def namespace(obj: Ctx, as_json: bool) -> None:
    """The namespace's state (ok | lost | recovering | missing), epoch, claim sequence and fence floor.
    Read only: it never creates a namespace. Exit 3 when the namespace lost state."""
    client = obj.reader
    info = client.reads.namespace()
    refused = client.reads.refusals(count=100)
    data = {**dataclasses.asdict(info), "events": client.reads.namespace_events(count=1000), "refused": refused}
    if as_json:
        emit_json(data)
    else:
        from ..ops.render import text_console, wrap

        width = text_console().width
        lines = wrap(f"{info.prefix}: {info.state} (epoch {info.epoch or '-'}, claims {info.seq}, "
                     f"fence floor {info.floor})" + (f": {info.reason}" if info.reason else ""), width)
        if refused:
            lines += wrap(f"{len(refused)}{'+' if len(refused) == 100 else ''} transport messages refused by "
                          f"workers, newest: {refused[0].get('reason', refused[0]['type'])}", width)
        click.echo("\n".join(lines))
    exit_if_lost(info)
