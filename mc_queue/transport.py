"""How mc_queue names things in RQ, its execution transport (the producer and the worker both use it).

An RQ job carries only ids, serialized as JSON: ``mc_queue.worker.run_attempt(prefix, attempt_id,
lease_ms)`` (the worker takes the lease length from the task, not from the message). Its job id is
derived from the attempt id, so dispatching an Attempt twice makes one RQ job.
"""

from __future__ import annotations

import hashlib

import redis

from .client import Client, quiet_connection_kwargs
from .keys import parse_attempt_id

ENTRY = "mc_queue.worker.run_attempt"


def rq_queue_name(prefix: str, queue: str) -> str:
    return f"mcq:{prefix}:{queue}"


def job_id(prefix: str, attempt_id: str) -> str:
    """One RQ job id per Attempt (RQ allows only [A-Za-z0-9_-] in ids)."""
    task_id, n = parse_attempt_id(attempt_id)
    ulid = task_id.rsplit(":", 1)[1]
    ns = hashlib.sha1(f"{prefix}\0{task_id.rsplit(':', 1)[0]}".encode()).hexdigest()[:8]
    return f"mcq-{ns}-{ulid}-{n}"


def rq_connection(client: Client) -> redis.Redis:
    """RQ needs bytes responses; same server and credentials as the client."""
    return redis.Redis.from_url(client.url, socket_timeout=30, socket_connect_timeout=10,
                                **quiet_connection_kwargs())
