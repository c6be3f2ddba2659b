"""The console's series per queue, kept in Redis so a restarted console still draws the last hour.

Every ``interval_s`` (10 s) the console appends one sample per queue to ``Keys.queue_samples(queue)``,
a stream capped at :data:`KEEP` entries (XADD MAXLEN, a bit over an hour), its id stamped by
Redis's clock: the queue age (oldest claimable pending Attempt's wait, as ``mcq status``), the depth
(pending + backoff tasks) and running tasks from ``Reads.status()``, and the totals of Attempts
finished per outcome from the stats hash the scripts count in (``fin|<queue>|<handler>|<outcome>|<bucket>``,
the counters behind ``mcq_attempts_finished_total``). Throughput and failure rate over the window are
differences of those totals between the first and the last sample. When several consoles watch one
namespace, a console skips a queue whose newest sample is younger than most of an interval.

Only the queues ``Reads.queues()`` lists and that hold a task are sampled: a queue whose tasks were
all retired adds no sample (its stream ages out of the window; the core forgets such a queue and
deletes its samples), so the sampler's cost follows the queues in use, not every queue ever named.

The chart is drawn on the server as inline SVG (no script, no library): one line per run of
samples, broken where the console was not running.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

from ...client import Client
from ...contracts.keys import check_queue

INTERVAL_S = 10.0
WINDOW_MS = 3_600_000
KEEP = 400  # samples kept per queue: an hour at 10 s, and some slack
OUTCOMES = ("succeeded", "failed", "canceled")


def redis_now_ms(client: Client) -> int:
    sec, usec = client.redis.time()
    return int(sec) * 1000 + int(usec) // 1000


def finished_totals(stats: Mapping[str, str]) -> dict[str, dict[str, int]]:
    """Per queue: Attempts finished so far by outcome, from the stats hash's per-bucket counts."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(OUTCOMES, 0))
    for name, value in stats.items():
        if not name.startswith("fin|"):
            continue
        parts = name.split("|")
        if len(parts) != 5 or not parts[4].isdigit():
            continue
        try:
            n = int(value)
        except ValueError:
            continue
        row = out[parts[1]]
        row[parts[3]] = row.get(parts[3], 0) + n
    return dict(out)


def sample(client: Client, *, interval_s: float = INTERVAL_S) -> int:
    """Append one sample per listed queue that holds a task (skipping queues another console sampled
    less than ~an interval ago); returns how many were written."""
    status = client.reads.status()
    listed = set(client.reads.queues())
    stats = cast(dict[str, str], client.redis.hgetall(client.keys.stats))
    totals = finished_totals(stats)
    queues = [q for q in sorted(status) if q in listed and any(status[q]["counts"].values()) and _valid_queue(q)]
    if not queues:
        return 0
    now = redis_now_ms(client)
    pipe = client.redis.pipeline(transaction=False)
    for q in queues:
        pipe.xrevrange(client.keys.queue_samples(q), count=1)
    newest = pipe.execute()
    written = 0
    for q, last in zip(queues, newest, strict=True):
        if last and now - _entry_ms(str(last[0][0])) < interval_s * 800:
            continue
        counts = status[q]["counts"]
        done = totals.get(q, dict.fromkeys(OUTCOMES, 0))
        fields = {"age_ms": int(status[q]["queue_age_ms"]),
                  "depth": int(counts.get("pending", 0)) + int(counts.get("backoff", 0)),
                  "running": int(counts.get("running", 0)),
                  **{o: int(done.get(o, 0)) for o in OUTCOMES}}
        pipe.xadd(client.keys.queue_samples(q), fields, maxlen=KEEP, approximate=False)  # type: ignore[arg-type]
        written += 1
    if written:
        pipe.execute()
    return written


def _valid_queue(queue: str) -> bool:
    try:
        check_queue(queue)
    except ValueError:
        return False
    return True


def _entry_ms(entry_id: str) -> int:
    return int(entry_id.split("-", 1)[0])


@dataclass
class Series:
    """One queue's samples of the window: (ms, fields) oldest first."""

    points: list[tuple[int, dict[str, int]]]
    now_ms: int
    window_ms: int = WINDOW_MS

    def rates(self) -> dict[str, Any] | None:
        """Attempts finished between the first and the last sample, per minute, and the share that failed."""
        if len(self.points) < 2:
            return None
        (t0, first), (t1, last) = self.points[0], self.points[-1]
        span_ms = t1 - t0
        if span_ms <= 0:
            return None
        done = {o: max(0, last.get(o, 0) - first.get(o, 0)) for o in OUTCOMES}
        total = sum(done.values())
        return {"span_ms": span_ms, "finished": total, **done,
                "per_min": total * 60_000 / span_ms,
                "failure_rate": (done["failed"] / total) if total else None}


def read_series(client: Client, queues: list[str], now_ms: int, *, window_ms: int = WINDOW_MS) -> dict[str, Series]:
    pipe = client.redis.pipeline(transaction=False)
    for q in queues:
        pipe.xrange(client.keys.queue_samples(q), min=str(now_ms - window_ms), max="+")
    out: dict[str, Series] = {}
    for q, entries in zip(queues, pipe.execute(), strict=True):
        points = []
        for entry_id, fields in entries:
            try:
                points.append((_entry_ms(str(entry_id)), {str(k): int(v) for k, v in fields.items()}))
            except ValueError:
                continue  # a sample someone else wrote: not ours to draw
        out[q] = Series(points, now_ms, window_ms)
    return out


def _nice_max(value: float) -> float:
    """A round upper bound for the y axis (1, 2, 5 x 10^n), at least 1."""
    if value <= 1:
        return 1.0
    magnitude = 10 ** (len(str(int(value))) - 1)
    for step in (1, 2, 5, 10):
        if value <= step * magnitude:
            return float(step * magnitude)
    return float(10 * magnitude)


def chart(series: Series, field_name: str = "age_ms", *, scale: float = 1000.0, width: int = 600,
          height: int = 120, interval_s: float = INTERVAL_S) -> dict[str, Any]:
    """An SVG line chart of one field over the window (x: time, y: value / scale), as the pieces the
    template draws: ``paths`` (one per run of samples without a gap), ``area`` paths, ``ymax``."""
    start = series.now_ms - series.window_ms
    values = [(t, fields.get(field_name, 0) / scale) for t, fields in series.points if t >= start]
    peak = max((v for _, v in values), default=0.0)
    ymax = _nice_max(peak)
    gap_ms = interval_s * 1000 * 3
    runs: list[list[tuple[float, float]]] = []
    previous: int | None = None
    for t, v in values:
        x = (t - start) / series.window_ms * width
        y = height - (v / ymax) * (height - 4) - 2
        if previous is None or t - previous > gap_ms:
            runs.append([])
        runs[-1].append((round(x, 1), round(y, 1)))
        previous = t
    paths = [" ".join(f"{'M' if i == 0 else 'L'}{x},{y}" for i, (x, y) in enumerate(run)) for run in runs]
    areas = [f"M{run[0][0]},{height} " + " ".join(f"L{x},{y}" for x, y in run) + f" L{run[-1][0]},{height} Z"
             for run in runs if len(run) > 1]
    dots = [run[0] for run in runs if len(run) == 1]
    return {"width": width, "height": height, "paths": paths, "areas": areas, "dots": dots, "ymax": ymax,
            "peak": peak, "samples": len(values),
            "grid": [round(height - f * (height - 4) - 2, 1) for f in (0.5, 1.0)]}
