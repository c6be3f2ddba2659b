from __future__ import annotations

import pytest

from mc_queue.contracts.keys import Keys, attempt_id, new_task_id, new_ulid, parse_attempt_id, parse_task_id


def test_every_key_of_a_namespace_shares_one_hash_tag() -> None:
    k = Keys("prod")
    tk = k.task(new_task_id("fixes"))
    all_keys = [k.meta, k.epochs, k.idem, k.queues, k.counts, k.leases, k.suspect, k.pending("fixes"),
                tk.task, tk.attempts, tk.attempts_v1, tk.events, tk.pending]
    assert all(key.startswith("{prod}:") for key in all_keys)
    # tk.pending is k.pending("fixes"); the Attempts are fields of the task hash (tk.attempts_v1: where a
    # task written before 2026-12 keeps them)
    assert tk.attempts == tk.task and tk.attempts_v1 == tk.task + ":a"
    assert len(set(all_keys)) == len(all_keys) - 2


def test_task_id_carries_its_queue_and_sorts_by_time() -> None:
    a, b = new_task_id("q1"), new_task_id("q1")
    assert parse_task_id(a) == "q1"
    assert len(new_ulid()) == 26
    assert a[:13] <= b[:13]  # millisecond part first


@pytest.mark.parametrize("bad", ["", "has space", "-lead", "x" * 65, "a:b", "a/b", "{tag}"])
def test_bad_queue_names_are_refused_with_the_rule(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid queue name"):
        new_task_id(bad)


def test_attempt_ids_round_trip_and_reject_garbage() -> None:
    tid = new_task_id("q")
    assert parse_attempt_id(attempt_id(tid, 3)) == (tid, 3)
    for bad in [tid, f"{tid}/0", f"{tid}/x", "nope/1", f"{tid}/-1"]:
        with pytest.raises(ValueError):
            parse_attempt_id(bad)


def test_prefix_is_validated() -> None:
    with pytest.raises(ValueError):
        Keys("bad prefix")
    with pytest.raises(ValueError):
        Keys("{x}")
