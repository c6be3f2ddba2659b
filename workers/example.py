"""The example agent App (see mc_queue/examples/agents.py): `mcq worker --app workers.example:app`."""

from mc_queue.examples.agents import app

__all__ = ["app"]
