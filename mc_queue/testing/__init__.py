"""Helpers for testing code built on mc_queue against real processes: private redis-servers on free
loopback ports, Sentinel failover clusters, a TCP proxy that delays, pauses, drops and cuts a link, a
git forge over HTTP and bare git remotes, and a recorder of every transition a run makes.

They never touch the machine's shared Redis.
"""

from __future__ import annotations

from ..store.embedded import find_redis_server
from .forge import ForgeServer, bare_git_remote
from .proxy import TcpProxy
from .recorder import TransitionRecorder
from .servers import FailoverCluster, RedisServer, RepeatableFailoverCluster, SentinelServer, free_port, unique_prefix

__all__ = [
    "FailoverCluster",
    "ForgeServer",
    "RedisServer",
    "RepeatableFailoverCluster",
    "SentinelServer",
    "TcpProxy",
    "TransitionRecorder",
    "bare_git_remote",
    "find_redis_server",
    "free_port",
    "unique_prefix",
]
