"""bench_core.py of two commits in one run: the baseline's and this checkout's, alternating, with ratios.

Run from the repository root::

    .venv/bin/python bench/bench_ab.py --baseline b5c06e4 [--rounds 3] [-- <bench_core.py arguments>]

The baseline commit is exported (``git archive``: mc_queue/, lua/ and bench/) into a temporary
folder. Each round runs the baseline's own ``bench/bench_core.py`` with its own ``mc_queue`` and this
checkout's with this checkout's (each in a subprocess that imports only its own package; the order
alternates between rounds), with the same arguments (default: ``--seconds 2 --repeat 1 --fsync
everysec --pin same --tasks 2000 --no-what-if``). The table gives each figure's median over the
rounds and the ratio head/baseline; a ratio within the rounds' own spread is no difference.
``--head REF`` measures a commit instead of the working tree. For a change that must not slow the
hot path (a refactoring, a facade): claim+complete cycles/s and enqueue/s are the figures to read.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bench_guards import export  # noqa: E402

DEFAULT_ARGS = ["--seconds", "2", "--repeat", "1", "--fsync", "everysec", "--pin", "same", "--tasks", "2000",
                "--no-what-if"]


def figures(doc: dict[str, Any]) -> dict[str, float]:
    """The figures of one bench_core --json document worth comparing, by name."""
    out: dict[str, float] = {}
    for m in doc["modes"]:
        tag = f"{m['fsync']}/{m['pin']}"
        reps = m["repeats"]
        out[f"claim+complete cycles/s ({tag})"] = statistics.median(r["cycles"]["per_s"] for r in reps)
        out[f"raw EVALSHA/s, the floor ({tag})"] = statistics.median(r["raw"]["per_s"] for r in reps)
        out[f"enqueue tasks/s ({tag})"] = statistics.median(r["enqueue"]["per_s"] for r in reps)
        out[f"cycles per floor round trip ({tag})"] = statistics.median(r["ratio_per_round_trip"] for r in reps)
    mem = doc["memory"][0]
    for key in ("per_queued_task", "per_finished_task", "per_finished_task_packed"):
        out[f"Redis bytes {key.removeprefix('per_').replace('_', ' ')}"] = float(mem[key])
    return out


def run(tree: Path, args: list[str], out: Path) -> dict[str, float]:
    subprocess.run([sys.executable, str(tree / "bench" / "bench_core.py"), *args, "--json", str(out)], cwd=tree,
                   env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin:/usr/local/bin"}, check=True,
                   stdout=subprocess.DEVNULL)
    return figures(json.loads(out.read_text()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, help="the commit to compare against")
    ap.add_argument("--head", default=None, help="a commit to measure instead of the working tree")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    ap.add_argument("core_args", nargs="*", help="bench_core.py's arguments (after --)")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    core_args = args.core_args or DEFAULT_ARGS
    tmp = Path(tempfile.mkdtemp(prefix="mcq-ab-"))
    try:
        trees = {"baseline": export(args.baseline, tmp, parts=("mc_queue", "lua", "bench")),
                 "head": export(args.head, tmp, parts=("mc_queue", "lua", "bench")) if args.head else ROOT}
        got: dict[str, list[dict[str, float]]] = {"baseline": [], "head": []}
        for i in range(args.rounds):
            for label in ("baseline", "head") if i % 2 == 0 else ("head", "baseline"):
                got[label].append(run(trees[label], core_args, tmp / f"{label}-{i}.json"))
                cyc = next(v for k, v in got[label][-1].items() if k.startswith("claim+complete"))
                print(f"round {i + 1} {label}: {cyc:,.0f} claim+complete cycles/s", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    names = list(got["head"][0])
    rows = {n: (statistics.median(r[n] for r in got["baseline"]), statistics.median(r[n] for r in got["head"]))
            for n in names}
    spread = {n: (min(r[n] for r in got["head"] + got["baseline"]), max(r[n] for r in got["head"] + got["baseline"]))
              for n in names}
    head = args.head or "this checkout"
    print(f"bench_core.py {' '.join(core_args)}; {args.rounds} rounds alternating; medians")
    print()
    print(f"| figure | {args.baseline} | {head} | ratio | range over both |")
    print("|---|---|---|---|---|")
    for n, (old, new) in rows.items():
        lo, hi = spread[n]
        print(f"| {n} | {old:,.1f} | {new:,.1f} | {new / old:.3f} | {lo:,.1f} - {hi:,.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"baseline": args.baseline, "head": head, "args": core_args,
                                         "rounds": got}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
