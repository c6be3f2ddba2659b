"""A task's frozen records (retry policy, budget, manifest) stored as their changes from a frozen base
read back byte for byte as the full canonical JSON they were (mc_queue/contracts/frozen.py)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mc_queue.contracts.codec import model_json
from mc_queue.contracts.config import Backoff, Budget, RetryPolicy
from mc_queue.contracts.errors import InvalidArgument
from mc_queue.contracts.frozen import BASES, CURRENT, compact, expand
from mc_queue.contracts.models import FailureClass, Manifest

DIGEST = "ab" * 32


def test_the_current_base_is_what_the_models_default_to() -> None:
    """Changing a default must add a base (version 2) and keep version 1 for the tasks stored with it:
    a task enqueued before the change reads back the policy it froze, not the new default."""
    why = "a default changed: add a new base version in contracts/frozen.py, keep the old one"
    assert BASES["retry_policy"][CURRENT] == RetryPolicy().model_dump(mode="json"), why
    assert BASES["budget"][CURRENT] == Budget().model_dump(mode="json"), why
    full = Manifest(handler="h", payload_digest=DIGEST).model_dump(mode="json")
    assert BASES["manifest"][CURRENT] == {k: v for k, v in full.items() if k not in ("handler", "payload_digest")}, why


def test_defaults_are_a_few_bytes_and_read_back_in_full() -> None:
    for kind, model in (("retry_policy", RetryPolicy()), ("budget", Budget())):
        stored = compact(kind, model.model_dump(mode="json"))
        assert stored == '{"$v":1}'
        assert expand(kind, stored) == model_json(model)
    m = Manifest(handler="fix", payload_digest=DIGEST, lease_ms=10_000)
    stored = compact("manifest", m.model_dump(mode="json"), task={"handler": "fix", "payload_digest": DIGEST})
    assert stored == '{"$v":1,"lease_ms":10000}' and len(stored) <= 64
    assert expand("manifest", stored, handler="fix", payload_digest=DIGEST) == model_json(m)


def test_a_manifest_whose_handler_is_not_the_tasks_keeps_it() -> None:
    m = Manifest(handler="other", payload_digest=DIGEST)
    stored = compact("manifest", m.model_dump(mode="json"), task={"handler": "fix", "payload_digest": DIGEST})
    assert '"handler":"other"' in stored
    assert expand("manifest", stored, handler="fix", payload_digest=DIGEST) == model_json(m)


def test_a_record_stored_in_full_before_is_read_as_it_is() -> None:
    full = model_json(RetryPolicy(backoff=Backoff(base_s=2.0, max_s=60.0)))
    assert expand("retry_policy", full) == full
    legacy = model_json(Manifest(handler="fix", payload_digest=DIGEST, context={"$v": 1}))
    assert expand("manifest", legacy) == legacy  # a "$v" inside a field is not a compact record


def test_an_unknown_base_is_refused_with_what_to_do() -> None:
    with pytest.raises(InvalidArgument, match=r"base 7.*does not know.*version that wrote it"):
        expand("budget", '{"$v":7,"max_attempts":2}')


policies = st.builds(
    RetryPolicy,
    version=st.sampled_from(["default-v1", "p2"]),
    actions=st.dictionaries(st.sampled_from(list(FailureClass)),
                            st.sampled_from(["retry", "stop", "quarantine", "retry_if_new_hypothesis"]),
                            min_size=8, max_size=8),
    backoff=st.builds(Backoff, base_s=st.sampled_from([0.5, 1.0, 3.0]), max_s=st.sampled_from([60.0, 300.0])),
)
budgets = st.builds(Budget, max_attempts=st.integers(1, 50), max_interruptions=st.integers(0, 9),
                    max_cost=st.none() | st.floats(0.5, 1e6), max_wall_s=st.none() | st.floats(1.0, 1e5))
manifests = st.builds(Manifest, handler=st.sampled_from(["fix", "other"]),
                      payload_digest=st.sampled_from([DIGEST, "c" * 64]), model=st.none() | st.text(max_size=20),
                      context=st.dictionaries(st.text(max_size=5), st.integers()),
                      lease_ms=st.none() | st.integers(1, 10**7), timeout_s=st.none() | st.floats(1.0, 3600.0))


@given(policies, budgets, manifests)
def test_every_record_reads_back_byte_for_byte(policy: RetryPolicy, budget: Budget, manifest: Manifest) -> None:
    for kind, model in (("retry_policy", policy), ("budget", budget)):
        assert expand(kind, compact(kind, model.model_dump(mode="json"))) == model_json(model)
    task = {"handler": "fix", "payload_digest": DIGEST}
    stored = compact("manifest", manifest.model_dump(mode="json"), task=task)
    assert json.loads(stored)["$v"] == CURRENT
    assert expand("manifest", stored, **task) == model_json(manifest)
