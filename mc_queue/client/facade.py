"""The Client: one connection to a namespace, and the roles that make its calls.

Each role is one small class for one kind of caller; find the call by who you are::

    client = mc_queue.connect()
    task = client.producer.enqueue("agents", "fix_issue", {"issue": 42})   # a producer
    lease = client.leases.claim_attempt(task.id, "worker-1")                 # a worker holding a lease
    client.operator.retry_task(task.id, "the flaky provider is back up")     # a person deciding
    client.maintenance.expire_leases()                                       # the sweeper
    client.reads.get_task(task.id)                                           # anyone reading

Every role checks its arguments with the same bounds its script enforces again (bad input is
refused before anything is sent) and runs its scripts through the one
:class:`~mc_queue.store.backend.Backend` (resends by header, replication acknowledgement, lineage),
which turns a reply into a record or the one exception
:func:`~mc_queue.contracts.errors.raise_for_reply` maps it to. Orchestration lives above:
:mod:`mc_queue.policy.reconcile`, :mod:`mc_queue.policy.recovery`, :mod:`mc_queue.policy.classify`.
"""

from __future__ import annotations

from typing import Any

from ..store.backend import Backend
from .caps import Caps
from .dependencies import Dependencies
from .fairness import Fairness
from .holder import LeaseHolder
from .limits import Limits
from .maintenance import Maintenance
from .operator import Operator
from .periodic import Periodic
from .producer import Producer
from .reads import Reads
from .results import Results
from .schedule import Schedule
from .slots import Slots
from .spend import Spend


class Client:
    """A connection to one mc_queue namespace (the arguments are :class:`Backend`'s), handing out its roles.

    ``producer`` enqueues; ``leases`` is what a worker calls under its lease; ``operator`` what a person decides
    (retry, cancel, DLQ, pause, retention, recovery); ``maintenance`` the sweeper's bookkeeping; ``schedule``
    what is due to be sent to the transport; ``reads`` everything that explains what happened; ``results`` waits
    for tasks to end; ``periodic`` publishes, ticks and steers periodic schedules; ``dependencies`` releases the
    tasks whose parents ended; ``limits`` sets, pauses and reads rate limits; ``slots`` the concurrency keys;
    ``caps`` the queue caps (backpressure); ``spend`` the spend ceilings (denial of wallet); ``fairness`` the
    fair shares across keys and the fair lanes.
    ``backend`` runs the scripts and keeps the namespace epoch and replication
    lineage (``backend.open_namespace()``, ``backend.check_lineage()``).
    """

    def __init__(self, url: str, **options: Any) -> None:
        self.backend = backend = Backend(url, **options)
        self.url, self.target, self.keys, self.actor = backend.url, backend.target, backend.keys, backend.actor
        self.redis, self.writer, self.runner = backend.redis, backend.writer, backend.runner
        self.reads = Reads(backend)
        self.producer = Producer(backend, self.reads)
        self.leases = LeaseHolder(backend)
        self.maintenance = Maintenance(backend)
        self.schedule = Schedule(backend)
        self.operator = Operator(backend, self.maintenance)
        self.results = Results(backend, self.reads)
        self.periodic = Periodic(backend, self.producer, self.operator)
        self.dependencies = Dependencies(backend)
        self.limits = Limits(backend)
        self.slots = Slots(backend)
        self.caps = Caps(backend)
        self.spend = Spend(backend)
        self.fairness = Fairness(backend)
        self.embedded: Any = None  # set by connect() when it started or reused the embedded server

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

