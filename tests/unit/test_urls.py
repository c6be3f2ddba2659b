"""Redis URLs (mc_queue.urls), the replication watermark's judgement and slot files (mc_queue.lineage),
and which scripts wait for replicas (mc_queue.scripts): pure code and files, no server."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

import mc_queue
from mc_queue.errors import ConfigurationError, ReplicationUnconfirmed, WriteRefused, replication_unconfirmed
from mc_queue.lineage import NO_REPLID, Replication, SlotStore, Watermark, judge
from mc_queue.scripts import ACKNOWLEDGED, REDERIVED, specs
from mc_queue.urls import make_redis, parse_url, redacted, sentinel_url

A, B = "a" * 40, "b" * 40


# --------------------------------------------------------------------------- URLs


def test_a_sentinel_url_names_sentinels_service_db_credentials_and_options() -> None:
    t = parse_url("redis+sentinel://alice:s%40cret@10.0.0.1:26380,[::1]:26381,sentinel-c/mymaster/3"
                  "?min_replicas=1&replica_timeout_ms=250&sentinel_password=pw&track_replication=on")
    assert t.sentinel and not t.tls
    assert t.sentinels == (("10.0.0.1", 26380), ("::1", 26381), ("sentinel-c", 26379))
    assert (t.service, t.db, t.username, t.password) == ("mymaster", 3, "alice", "s@cret")
    assert (t.min_replicas, t.replica_timeout_ms, t.track_replication) == (1, 250, "on")
    assert t.sentinel_kwargs == {"password": "pw"}
    assert "s@cret" not in t.where and "pw" not in t.where


def test_a_direct_url_goes_to_redis_py_without_mc_queues_own_parameters() -> None:
    t = parse_url("redis://u:p@h:6380/2?min_replicas=2&socket_keepalive=true")
    assert not t.sentinel and t.min_replicas == 2
    assert t.redis_url == "redis://u:p@h:6380/2?socket_keepalive=true"
    plain = "rediss://h:6380/0?ssl_cert_reqs=none"
    assert parse_url(plain).redis_url == plain and parse_url(plain).min_replicas is None


@pytest.mark.parametrize(("url", "says"), [
    ("", "empty"),
    ("localhost:6379", "no scheme"),
    ("http://h:1/0", "unknown scheme"),
    ("redis+sentinel:///mymaster", "names no sentinel"),
    ("redis+sentinel://h:26379", "names no service"),
    ("redis+sentinel://h:26379/", "names no service"),
    ("redis+sentinel://h:26379/m/1/2", "/service or /service/db"),
    ("redis+sentinel://h:26379/m/x", "db must be a whole number"),
    ("redis+sentinel://h:port/m", "port of sentinel h"),
    ("redis+sentinel://h:0/m", "port of sentinel h"),
    ("redis+sentinel://:26379/m", "has no host"),
    ("redis+sentinel://h/m?ssl_ca_certs=/x", "need rediss+sentinel"),
    ("redis+sentinel://h/m?foo=1", "unknown parameter 'foo'"),
    ("redis+sentinel://h/m?socket_timeout=0", "socket_timeout"),
    ("redis://h/0?min_replicas=-1", "min_replicas must be a whole number from 0 to 16"),
    ("redis://h/0?min_replicas=17", "min_replicas"),
    ("redis://h/0?min_replicas=01", "min_replicas"),
    ("redis://h/0?replica_timeout_ms=0", "replica_timeout_ms"),
    ("redis://h/0?track_replication=maybe", "track_replication must be one of auto, on, off"),
    ("redis://h/0?min_replicas=1&min_replicas=2", "given twice"),
])
def test_a_bad_url_is_refused_saying_what_is_wrong(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)):
        parse_url(url)


def test_a_bad_url_message_does_not_show_the_password() -> None:
    with pytest.raises(ConfigurationError) as exc:
        parse_url("redis+sentinel://u:topsecret@h/m?sentinel_password=alsosecret&foo=1")
    assert "topsecret" not in str(exc.value) and "alsosecret" not in str(exc.value)
    assert redacted("redis://:pw@h:1/0") == "redis://:***@h:1/0"


def test_sentinel_url_round_trips() -> None:
    url = sentinel_url([("127.0.0.1", 1), ("::1", 2)], "svc", db=1, password="p w", min_replicas=1)
    t = parse_url(url)
    assert (t.sentinels, t.service, t.db, t.password, t.min_replicas) == (
        (("127.0.0.1", 1), ("::1", 2)), "svc", 1, "p w", 1)


def test_the_factory_builds_a_client_that_asks_the_sentinels_for_the_primary() -> None:
    r = make_redis("rediss+sentinel://u:p@127.0.0.1:1/svc/2?ssl_cert_reqs=none&sentinel_password=sp",
                   decode_responses=True, socket_timeout=3)
    pool = r.connection_pool
    assert isinstance(pool, SentinelConnectionPool) and pool.service_name == "svc"
    kw = pool.connection_kwargs
    assert (kw["db"], kw["username"], kw["password"], kw["decode_responses"], kw["ssl_cert_reqs"]) == (
        2, "u", "p", True, "none")
    assert "SSL" in pool.connection_class.__name__
    manager = pool.sentinel_manager
    assert [s.connection_pool.connection_kwargs["port"] for s in manager.sentinels] == [1]
    assert manager.sentinels[0].connection_pool.connection_kwargs["password"] == "sp"
    r.close()


def test_a_client_takes_min_replicas_from_the_url_and_refuses_a_wait_longer_than_its_socket_timeout() -> None:
    q = mc_queue.Client("redis://127.0.0.1:1/0?min_replicas=2&replica_timeout_ms=300", prefix="u")
    assert (q.min_replicas, q.replica_timeout_ms, q.runner.min_replicas, q.tracking) == (2, 300, 2, True)
    assert mc_queue.Client("redis://127.0.0.1:1/0?min_replicas=2", prefix="u", min_replicas=0).min_replicas == 0
    assert not mc_queue.Client("redis://127.0.0.1:1/0", prefix="u").tracking  # auto: decided on connect
    assert mc_queue.Client("redis+sentinel://127.0.0.1:1/m", prefix="u").tracking
    with pytest.raises(ConfigurationError, match="below the socket timeout"):
        mc_queue.Client("redis://127.0.0.1:1/0?min_replicas=1&replica_timeout_ms=5000", prefix="u", socket_timeout=2)
    with pytest.raises(ConfigurationError, match="bad Redis URL"):
        mc_queue.Client("redis+sentinel://127.0.0.1:1", prefix="u")


# --------------------------------------------------------------------------- acknowledged writes


def test_every_script_either_waits_for_replicas_or_is_rederived() -> None:
    assert ACKNOWLEDGED | REDERIVED == set(specs()) and not ACKNOWLEDGED & REDERIVED
    assert {"enqueue", "claim", "complete", "fail", "effect_begin"} <= ACKNOWLEDGED


def test_replication_unconfirmed_stops_a_worker_and_tells_a_producer_to_resend() -> None:
    exc = replication_unconfirmed("enqueue", acked=0, wanted=1, timeout_ms=250)
    assert isinstance(exc, ReplicationUnconfirmed) and isinstance(exc, WriteRefused)
    assert isinstance(exc, mc_queue.OutcomeUnknown)
    assert "same idempotency key" in str(exc) and "0 of 1" in str(exc) and exc.script == "enqueue"
    assert "do not call the provider" in str(replication_unconfirmed("effect_begin", acked=0, wanted=2,
                                                                     timeout_ms=1))


# --------------------------------------------------------------------------- the watermark


def _repl(replid: str, offset: int, replid2: str = NO_REPLID, second: int = -1) -> Replication:
    return Replication("master", replid, replid2, offset, second, 0)


def test_judge_finds_acknowledged_offsets_a_failover_did_not_take_over() -> None:
    promoted = _repl(B, 500, A, 401)  # took over A's history up to offset 400
    assert judge({A: 400}, promoted)[:2] == (None, {B: 400})
    why, rebased, _ = judge({A: 401}, promoted)
    assert why is not None and "up to offset 400" in why and "acknowledged at offset 401" in why
    assert rebased == {}
    assert judge({B: 499, A: 10}, promoted)[:2] == (None, {B: 499})
    why, _, _ = judge({B: 501}, promoted)
    assert why is not None and "ends at offset 500" in why
    # A history this primary does not know cannot be judged: ignored, reported.
    assert judge({"c" * 40: 10**9}, promoted) == (None, {}, ["c" * 40])
    # A primary that never took over a history knows only its own.
    assert judge({A: 5}, _repl(B, 1)) == (None, {}, [A])


def test_replication_is_read_from_info_text_with_all_digit_ids_kept() -> None:
    text = ("# Replication\r\nrole:master\r\nconnected_slaves:1\r\n"
            "master_replid:0123456789012345678901234567890123456789\r\nmaster_replid2:0000000000000000000000000000000000000000\r\nmaster_repl_offset:42\r\n"
            "second_repl_offset:-1\r\n")
    r = Replication.parse(text)
    assert (r.role, r.replid, r.replid2, r.offset, r.replicas, r.promoted) == (
        "master", "0123456789012345678901234567890123456789", NO_REPLID, 42, 1, False)


def test_a_record_survives_its_process_and_is_taken_over_by_the_next(tmp_path: Path) -> None:
    wm = Watermark()
    wm.note("1.ab", A, 100)
    wm.note_seq("1.ab", 7)
    first = SlotStore(tmp_path, "pfx")
    first.write(wm)
    assert first.slot == 0
    other = SlotStore(tmp_path, "pfx")  # another process's view (a second lock holder in this test)
    other_wm = Watermark()
    other_wm.note("1.ab", A, 50)
    if os.name == "posix":  # lockf is per process: in one process the same slot can be taken twice
        other.write(other_wm)
    merged = SlotStore(tmp_path, "pfx").read_all()
    assert merged.of_epoch("1.ab")[A] >= 100 and merged.seqs == {"1.ab": 7} and merged.of_epoch("2.ab") == {}
    first.close()
    # the slot's record is merged into whoever takes it next: nothing is dropped
    taker = Watermark()
    nxt = SlotStore(tmp_path, "pfx")
    nxt.write(taker)
    assert taker.of_epoch("1.ab")[A] >= 50 and nxt.read_all().of_epoch("1.ab")[A] == 100
    assert SlotStore(tmp_path, "other").read_all() == Watermark()


def test_a_torn_or_foreign_record_is_skipped() -> None:
    wm = Watermark({f"1.ab/{A}": 1}, {})
    data = wm.encode()
    assert Watermark.decode(data) == wm
    assert Watermark.decode(data[:20]) is None
    assert Watermark.decode(data.replace(b'"v":1', b'"v":2')) is None
    assert Watermark.decode(b"") is None


def test_marks_and_seqs_stay_bounded() -> None:
    wm = Watermark()
    for i in range(20):
        wm.note(f"{i}.aa", f"{i:040d}", i)
        wm.note_seq(f"{i}.aa", i + 1)
    assert len(wm.marks) == 8 and len(wm.seqs) == 4 and wm.of_epoch("19.aa") == {f"{19:040d}": 19}
    assert len(wm.encode()) == len(Watermark().encode())
    assert not wm.note("19.aa", f"{19:040d}", 3)  # never backwards


def test_redis_py_client_default_is_unchanged_for_plain_urls() -> None:
    r = make_redis("redis://127.0.0.1:1/0")
    assert isinstance(r, redis.Redis) and r.connection_pool.connection_kwargs["port"] == 1
    r.close()
