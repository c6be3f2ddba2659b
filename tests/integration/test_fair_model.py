"""The fair lanes against a model (issue 19): random pushes, pops, weight changes and trims on a real
redis-server, every step checked against stride scheduling written out in Python.

After every step: each key's lane holds exactly the model's messages in order; the turns hold exactly the
keys with messages queued, at the model's passes; the idle passes kept are the model's. Each pop takes
the head of the lane whose (pass, key) is lowest, which is what makes the shares follow the weights.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import hypothesis.strategies as st
import pytest
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import mc_queue
from mc_queue.testing import RedisServer, unique_prefix

KEYS = ["tenant:a", "tenant:b", "tenant:c", "solo"]
QUEUE = "jobs"
STRIDE = 1_000_000


class FairLanes(RuleBasedStateMachine):
    server: RedisServer

    @initialize()
    def start(self) -> None:
        self.q = mc_queue.connect(self.server.url, prefix=unique_prefix("fairmodel"))
        self.q.backend.open_namespace()
        self.keys = {"lanes": self.q.keys.fair_lanes(QUEUE, 5), "turns": self.q.keys.fair_turns(QUEUE, 5)}
        self.lanes: dict[str, deque[str]] = {k: deque() for k in KEYS}
        self.passes: dict[str, int] = {}  # keys with messages queued -> pass
        self.idle: dict[str, int] = {}  # emptied keys -> the pass they left with
        self.vt = 0
        self.weights: dict[str, int] = {}  # "<key>" or "tenant:*" -> weight
        self.n = 0

    def teardown(self) -> None:
        if hasattr(self, "q"):
            self.q.close()

    def weight(self, key: str) -> int:
        fam = key.partition(":")[0] + ":*" if ":" in key else None
        return self.weights.get(key) or (self.weights.get(fam, 0) if fam else 0) or 1

    def now(self) -> int:
        return min(self.passes.values()) if self.passes else self.vt

    @rule(key=st.sampled_from(KEYS), count=st.integers(1, 3))
    def push(self, key: str, count: int) -> None:
        for _ in range(count):
            self.n += 1
            jid = f"mcq-job-{self.n}"
            reply = self.q.runner.run("fair_push", self.keys, {"lane": key, "job_id": jid})
            assert reply[0] == "OK"
            self.lanes[key].append(jid)
            if key not in self.passes:
                self.passes[key] = max(self.now(), self.idle.pop(key, 0))

    @rule()
    def pop(self) -> None:
        reply = self.q.runner.run("fair_pop", {**self.keys, "limits": self.q.keys.limits}, {"limit": 10})
        if not self.passes:
            assert reply[0] == "NOOP", reply
            return
        key = min(self.passes, key=lambda k: (self.passes[k], k))
        jid = self.lanes[key].popleft()
        assert reply[:3] == ["OK", jid, key], (reply, key, jid)
        before = self.passes[key]
        after = before + max(1, STRIDE // self.weight(key))
        if self.lanes[key]:
            self.passes[key] = after
        else:
            del self.passes[key]
            self.idle[key] = after
            self.vt = before

    @rule(key=st.sampled_from([*KEYS, "tenant:*"]), weight=st.sampled_from([None, 1, 2, 3, 7, 1000]))
    def weigh(self, key: str, weight: int | None) -> None:
        if weight is None:
            self.q.fairness.delete_weight(key, reason="the model changes it")
            self.weights.pop(key, None)
        else:
            self.q.fairness.set_weight(key, weight, reason="the model changes it")
            self.weights[key] = weight

    @rule()
    def trim(self) -> None:
        now = self.now()
        gone = [k for k, p in self.idle.items() if p <= now]
        assert self.q.fairness.trim(QUEUE) == len(gone)
        for k in gone:
            del self.idle[k]

    @invariant()
    def lanes_turns_and_passes_are_the_model_s(self) -> None:
        if not hasattr(self, "q"):
            return
        raw: dict[str, Any] = self.q.redis.hgetall(self.keys["lanes"])
        for key in KEYS:
            h, t = raw.get(f"{key}|h"), raw.get(f"{key}|t")
            held = [raw[f"{key}|{i}"] for i in range(int(h), int(t) + 1)] if h and t else []
            assert held == list(self.lanes[key]), (key, held, self.lanes[key])
            for jid in held:
                assert raw[f"j:{jid}"].startswith(f"{key}|")
        turns = dict(self.q.redis.zrange(self.keys["turns"], 0, -1, withscores=True))
        assert {k: int(v) for k, v in turns.items()} == self.passes
        assert {k[:-2]: int(v) for k, v in raw.items() if k.endswith("|p")} == self.idle


@pytest.mark.parametrize("run", [0])
def test_the_fair_lanes_follow_stride_scheduling(redis_server: RedisServer, run: int) -> None:
    FairLanes.server = redis_server
    test = FairLanes.TestCase
    test.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
    test().runTest()
