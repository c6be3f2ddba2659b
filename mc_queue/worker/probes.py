"""Health probes: a worker's own cheap checks of the dependencies its App declares (``app.probe(key, fn)``),
run by a thread of each worker process every ``every_s``, each call bounded by ``timeout_s``. While the
probe of a key fails, this worker claims no Attempt of a task that names the key (``limits``/``needs``):
the message is refused before the claim (nothing held, the task stays pending; the sweeper sends it again
after its recheck time, to this worker or another whose probe passes). Distinct from heartbeats, which
gate a lease's renewal, and from circuit breakers, which judge a dependency fleet-wide from the calls'
outcomes: a probe is this process's view (its network, its credentials) before any call is made.

Each change of a probe's state (failing, passing again) is recorded in the refusals log (``probe_failed``,
``probe_passed``: ``mcq`` and the console show it) and logged."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from ..producer.app import ProbeSpec

log = logging.getLogger("mc_queue.worker.probes")


class Probes:
    """The probes of one worker process and what they last said. ``failing()``: key -> why, for the keys
    whose last probe failed (a key never probed yet counts as passing: a worker does not refuse all
    work for the first ``every_s`` of its life)."""

    def __init__(self, specs: Mapping[str, ProbeSpec], *, record: Callable[[str, dict[str, Any]], None] | None = None,
                 worker_id: str = "") -> None:
        self.specs = dict(specs)
        self.worker_id = worker_id
        self._record = record
        self._failing: dict[str, str] = {}
        self._lock = threading.Lock()
        self._next: dict[str, float] = {}
        self._pool = ThreadPoolExecutor(max_workers=max(1, len(self.specs)), thread_name_prefix="mcq-probe")

    def failing(self) -> dict[str, str]:
        with self._lock:
            return dict(self._failing)

    def published(self) -> dict[str, str]:
        """Each probe's state as the worker publishes it beside its liveness key (``mcq workers``, the
        metrics): key -> 'ok', or 'failing <why>'."""
        bad = self.failing()
        return {key: f"failing {bad[key]}" if key in bad else "ok" for key in self.specs}

    def refusal(self, keys: tuple[str, ...]) -> tuple[str, float] | None:
        """Why this worker must not claim a task naming these keys now, and how soon its probe runs again
        (seconds: the task is sent again then), or None."""
        bad = self.failing()
        for key in keys:
            if key in bad:
                return (f"dependency {key} fails its health probe on worker {self.worker_id} ({bad[key]}): not "
                        "claimed; the task stays pending for a worker whose probe passes, sent again in "
                        f"{self.specs[key].every_s:g} s", self.specs[key].every_s)
        return None

    def run_once(self, now: float | None = None) -> None:
        """Run every probe that is due (each bounded by its timeout), and note what changed."""
        at = time.monotonic() if now is None else now
        for key, spec in self.specs.items():
            if self._next.get(key, 0.0) > at:
                continue
            self._next[key] = at + spec.every_s
            why = self._probe(spec)
            with self._lock:
                was = self._failing.get(key)
                if why is None:
                    self._failing.pop(key, None)
                else:
                    self._failing[key] = why
            if (was is None) != (why is None):
                self._changed(key, why)

    def _probe(self, spec: ProbeSpec) -> str | None:
        future = self._pool.submit(spec.check)
        try:
            ok = future.result(timeout=spec.timeout_s)
        except FutureTimeout:
            return f"no answer within {spec.timeout_s:g} s"
        except Exception as exc:  # a probe that raises says the dependency is not usable
            return f"{type(exc).__name__}: {str(exc)[:300]}"
        return "the probe said no" if ok is False else None

    def _changed(self, key: str, why: str | None) -> None:
        if why is None:
            log.info("probe of %s passes again: Attempts that need it are claimed", key)
        else:
            log.warning("probe of %s fails (%s): Attempts that need it are not claimed here", key, why)
        if self._record is not None:
            try:
                self._record("probe_passed" if why is None else "probe_failed",
                             {"key": key, "worker": self.worker_id, "reason": why or "passes again"})
            except Exception as exc:  # Redis away: the log line above stands
                log.warning("probe change of %s not recorded: %s", key, exc)

    def loop(self, stop: threading.Event, tick_s: float = 0.1) -> None:
        """Run the probes until ``stop`` (a thread of the worker process)."""
        while not stop.is_set():
            self.run_once()
            stop.wait(tick_s)
        self._pool.shutdown(wait=False, cancel_futures=True)
