"""Layer 5, the consumer side: RQ workers that run Attempts under a lease, the handler's Context
(heartbeats, checkpoints, effects, cancellation), and per-Attempt workspaces.

``run_attempt`` is the one function an RQ job names (``mc_queue.worker.run_attempt``): RQ imports
it by that path, so it stays importable here whatever module holds it."""

from __future__ import annotations

from .attempt import run_attempt

__all__ = ["run_attempt"]
