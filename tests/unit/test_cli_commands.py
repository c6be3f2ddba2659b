"""``mcq`` has the commands it had when they all lived in one file, and each command group's module adds
its own to it (a module that defines a command nobody registered would go unnoticed otherwise)."""

from __future__ import annotations

import importlib
import pkgutil

import click

import mc_queue.cli
from mc_queue.cli import main

EXPECTED = {  # `mcq` and its groups (as cli/main.py registered them before the split; `wait`, `schedule`)
    "mcq": ["archive", "attention", "breakers", "cancel", "caps", "dashboard", "demo", "dlq", "enqueue", "expire",
            "fair", "health", "limits", "metrics",
            "namespace", "providers", "queue", "reconcile", "recover", "retention", "retry", "schedule", "server",
            "show", "slots", "spend", "status", "sweeper", "tasks", "wait", "worker", "workers"],
    "mcq archive": ["show"],
    "mcq breakers": ["close", "open"],
    "mcq caps": ["delete", "delete-bytes", "set", "set-bytes"],
    "mcq dlq": ["list", "purge", "replay", "show"],
    "mcq fair": ["cap", "delete", "set", "uncap"],
    "mcq health": ["worker"],
    "mcq limits": ["delete", "pause", "resume", "set"],
    "mcq providers": ["serve", "start", "stop"],
    "mcq queue": ["pause", "resume"],
    "mcq schedule": ["list", "pause", "resume", "trigger"],
    "mcq retention": ["set", "show"],
    "mcq server": ["start", "status", "stop"],
    "mcq slots": ["delete", "set"],
    "mcq spend": ["delete", "set"],
    "mcq tasks": ["purge"],
}
SHARED = {"errors", "options", "output", "root"}  # no command of their own


def registered(group: click.Group, path: str = "mcq") -> dict[str, click.Command]:
    out: dict[str, click.Command] = {}
    for name, cmd in group.commands.items():
        out[f"{path} {name}"] = cmd
        if isinstance(cmd, click.Group):
            out.update(registered(cmd, f"{path} {name}"))
    return out


def test_mcq_has_the_commands_it_had() -> None:
    groups = {"mcq": main, **{p: c for p, c in registered(main).items() if isinstance(c, click.Group)}}
    assert {path: sorted(g.commands) for path, g in groups.items()} == EXPECTED
    assert main.list_commands(click.Context(main)) == EXPECTED["mcq"]  # what `mcq --help` lists


def test_every_command_module_adds_its_commands_to_main() -> None:
    reachable = {id(c) for c in registered(main).values()}
    owners = set()
    for info in pkgutil.iter_modules(mc_queue.cli.__path__):
        module = importlib.import_module(f"mc_queue.cli.{info.name}")
        commands = [v for v in vars(module).values()
                    if isinstance(v, click.Command) and v.callback is not None
                    and v.callback.__module__ == module.__name__]
        if info.name in SHARED:
            assert commands == [] or commands == [main], info.name
            continue
        assert commands, f"mc_queue.cli.{info.name} defines no command"
        for c in commands:
            assert id(c) in reachable, f"{info.name}.{c.name} is not registered on mcq"
        owners.add(info.name)
    for path, cmd in registered(main).items():
        assert cmd.callback is not None and cmd.callback.__module__.removeprefix("mc_queue.cli.") in owners, path
