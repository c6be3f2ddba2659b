from __future__ import annotations

import math

import pytest

from mc_queue.contracts.codec import canonical_json, digest, encode_payload
from mc_queue.contracts.errors import InvalidPayload
from mc_queue.contracts.failures import fingerprint, make_failure, normalise_message
from mc_queue.contracts.models import FailureClass


def test_canonical_json_ignores_key_order() -> None:
    a, da = encode_payload({"b": 1, "a": [1, 2]})
    b, db = encode_payload({"a": [1, 2], "b": 1})
    assert a == b == '{"a":[1,2],"b":1}'
    assert da == db == digest(a)


@pytest.mark.parametrize("bad,match", [
    ([1, 2], "must be a JSON object"),
    ("text", "must be a JSON object"),
    ({"x": math.nan}, "JSON cannot carry"),
    ({"x": object()}, "not plain JSON"),
    ({"x": b"bytes"}, "not plain JSON"),
    ({"x": "y" * 600_000}, "over the"),
])
def test_bad_payloads_are_refused_with_what_to_do(bad: object, match: str) -> None:
    with pytest.raises(InvalidPayload, match=match):
        encode_payload(bad)


def test_result_must_be_json_too() -> None:
    with pytest.raises(InvalidPayload):
        canonical_json({1, 2}, what="result")


def test_fingerprint_is_stable_across_ids_times_and_numbers() -> None:
    m1 = "push to 4f9c2a1e failed at 2026-11-30T10:00:01Z after 3 tries (req 123e4567-e89b-12d3-a456-426614174000)"
    m2 = "push to 9abcdef0 failed at 2026-12-01T11:22:33Z after 4 tries (req 00000000-0000-0000-0000-000000000000)"
    assert normalise_message(m1) == normalise_message(m2)
    assert fingerprint("repository", "PushError", m1) == fingerprint(FailureClass.REPOSITORY, "PushError", m2)
    assert fingerprint("repository", "PushError", m1) != fingerprint("provider", "PushError", m1)
    assert fingerprint("repository", "PushError", m1) != fingerprint("repository", "OtherError", m1)
    f = make_failure("capacity", "RateLimited", "429 from provider")
    assert f.fingerprint and f.failure_class is FailureClass.CAPACITY
    with pytest.raises(ValueError):
        make_failure("not-a-class", "X")
