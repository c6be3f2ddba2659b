"""``mcq providers``: a local git remote and pull-request API, served in the background."""

from __future__ import annotations

import sys
from typing import Any

import click

from .errors import EXIT_REFUSED, fail, handle_errors
from .options import Ctx
from .root import main


@main.group()
def providers() -> None:
    """Local providers to try an app against: a bare git remote and a pull-request API (the ones `mcq demo`
    runs), served by a background process until `mcq providers stop`.

    \b
    eval "$(mcq providers start)"   # exports MCQ_GIT_REMOTE, MCQ_FORGE_URL, MCQ_FORGE_TIMEOUT
    mcq providers stop
    """


def _providers_dir(obj: Ctx, folder: str | None) -> Any:
    from pathlib import Path

    from ..store.embedded import prepare_home

    root = Path(folder).resolve() if folder else prepare_home(obj.home) / "providers"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    return root


def _providers_serving(root: Any) -> int:
    """The pid of the process serving the providers of ``root`` (0: none). It holds ``root/serve.lock``
    while it serves: a pid file alone could name whatever process took that pid since."""
    import fcntl
    import os

    try:
        fd = os.open(root / "serve.lock", os.O_RDONLY)
    except FileNotFoundError:
        return 0
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            return int((root / "serve.pid").read_text())
        except (OSError, ValueError):
            return 0
    finally:
        os.close(fd)
    return 0


DIR_OPTION = click.option("--dir", "folder", default=None, metavar="DIR",
                          help="Where they live (default <home>/providers; home: --home / $MCQ_HOME).")


@providers.command("start")
@DIR_OPTION
@click.pass_obj
@handle_errors
def providers_start(obj: Ctx, folder: str | None) -> None:
    """Start them (or find them running) and print their environment as shell `export` lines."""
    import os
    import subprocess
    import time

    root = _providers_dir(obj, folder)
    env_file = root / "env"
    if not _providers_serving(root):
        env_file.unlink(missing_ok=True)
        with open(root / "serve.log", "ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "mc_queue", "providers", "serve", "--dir", str(root)],
                                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                                    cwd=os.getcwd())
        deadline = time.monotonic() + 30
        while not env_file.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                fail(f"the providers did not start: see {root / 'serve.log'}", EXIT_REFUSED)
            time.sleep(0.05)
    click.echo(env_file.read_text(), nl=False)
    click.echo(f"providers in {root}, served by pid {_providers_serving(root)} (`mcq providers stop` stops them)",
               err=True)


@providers.command("serve", hidden=True)
@DIR_OPTION
@click.pass_obj
def providers_serve(obj: Ctx, folder: str | None) -> None:
    """What `mcq providers start` runs in the background: serve until SIGTERM."""
    import fcntl
    import os
    import shlex
    import shutil
    import signal

    from ..demo.fleet import provider_env

    root = _providers_dir(obj, folder)
    lock = open(root / "serve.lock", "w")  # held (and locked) until this process ends
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fail(f"providers already served in {root}", EXIT_REFUSED)
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)  # fresh ones: the pull-request API keeps its pulls in memory
    run.mkdir(mode=0o700)
    env = provider_env(run, export=False)
    (root / "serve.pid").write_text(str(os.getpid()))
    lines = "".join(f"export {k}={shlex.quote(env.env[k])}\n"
                    for k in ("MCQ_GIT_REMOTE", "MCQ_FORGE_URL", "MCQ_FORGE_TIMEOUT"))
    (root / "env.tmp").write_text(lines)
    os.replace(root / "env.tmp", root / "env")  # whole, or not there: `start` waits for it
    stop = {"now": False}

    def done(signum: int, frame: Any) -> None:
        stop["now"] = True

    signal.signal(signal.SIGTERM, done)
    signal.signal(signal.SIGINT, done)
    while not stop["now"]:
        signal.pause()
    env.stop()
    for name in ("env", "serve.pid"):
        (root / name).unlink(missing_ok=True)


@providers.command("stop")
@DIR_OPTION
@click.pass_obj
@handle_errors
def providers_stop(obj: Ctx, folder: str | None) -> None:
    """Stop them (the git remote stays in DIR/run until the next start)."""
    import os
    import signal
    import time

    root = _providers_dir(obj, folder)
    pid = _providers_serving(root)
    if not pid:
        click.echo(f"no providers are served in {root}")
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _providers_serving(root) and time.monotonic() < deadline:
        time.sleep(0.05)
    click.echo("stopped" if not _providers_serving(root) else f"pid {pid} did not stop within 15 s")
