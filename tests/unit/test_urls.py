"""Redis URLs (mc_queue.store.urls), the replication watermark's judgement and slot files (mc_queue.store.lineage),
and which scripts wait for replicas (mc_queue.store.scripts): pure code and files, no server."""

from __future__ import annotations

import os
import re
import urllib.parse
from pathlib import Path

import pytest
import redis
from redis.sentinel import SentinelConnectionPool

import mc_queue
from mc_queue.contracts.errors import ConfigurationError, ReplicationUnconfirmed, WriteRefused, replication_unconfirmed
from mc_queue.store.lineage import NO_REPLID, Replication, SlotStore, Watermark, judge
from mc_queue.store.scripts import ACKNOWLEDGED, REDERIVED, specs
from mc_queue.store.urls import make_redis, parse_url, redacted, sentinel_url

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
    b = q.backend
    assert (b.min_replicas, b.replica_timeout_ms, q.runner.min_replicas, b.tracking) == (2, 300, 2, True)
    overridden = mc_queue.Client("redis://127.0.0.1:1/0?min_replicas=2", prefix="u", min_replicas=0)
    assert overridden.backend.min_replicas == 0
    assert not mc_queue.Client("redis://127.0.0.1:1/0", prefix="u").backend.tracking  # auto: decided on connect
    assert mc_queue.Client("redis+sentinel://127.0.0.1:1/m", prefix="u").backend.tracking
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


# --------------------------------------------------------------------------- issue 15: URLs on every Python

# Every form the README documents, with IPv6 sentinels and data nodes among them.
README_FORMS = [
    ("redis+sentinel://127.0.0.1:26380,[::1]:26379/svc", (("127.0.0.1", 26380), ("::1", 26379)), "svc", 0),
    ("redis+sentinel://u:p@[::1]:26379,[2001:db8::7],s3:26381/mymaster/2?min_replicas=1",
     (("::1", 26379), ("2001:db8::7", 26379), ("s3", 26381)), "mymaster", 2),
    ("rediss+sentinel://:pw@[::ffff:10.0.0.1]:26379,[fe80::1]:1/m?ssl_cert_reqs=none&sentinel_password=sp",
     (("::ffff:10.0.0.1", 26379), ("fe80::1", 1)), "m", 0),
    ("redis+sentinel://[::1],[::2]/svc/15", (("::1", 26379), ("::2", 26379)), "svc", 15),
]


def _strict_urlsplit(calls: list[str]):  # type: ignore[no-untyped-def]
    """urlsplit as Debian's 3.11.2 and current CPython releases behave: a '[' in a netloc that holds more
    than one host is 'Invalid IPv6 URL'. Records every URL it is asked to split."""
    import urllib.parse
    real = urllib.parse.urlsplit

    def split(url, scheme="", allow_fragments=True):  # type: ignore[no-untyped-def]
        text = url if isinstance(url, str) else url.decode()
        calls.append(text)
        netloc = text.partition("://")[2]
        for stop in "/?#":
            netloc = netloc.partition(stop)[0]
        if "," in netloc and "[" in netloc:
            raise ValueError("Invalid IPv6 URL")
        return real(url, scheme, allow_fragments)
    return split


@pytest.mark.parametrize(("url", "sentinels", "service", "db"), README_FORMS)
def test_the_suite_fails_on_a_fresh_debian_machine_ipv6_sentinel_urls_parse_where_urlsplit_refuses_them(
        url: str, sentinels: tuple[tuple[str, int], ...], service: str, db: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.parse

    import mc_queue.store.urls as urls
    calls: list[str] = []
    strict = _strict_urlsplit(calls)
    monkeypatch.setattr(urllib.parse, "urlsplit", strict)
    monkeypatch.setattr(urls, "urlsplit", strict, raising=False)
    t = parse_url(url)
    assert (t.sentinels, t.service, t.db) == (sentinels, service, db)
    assert "," not in "".join(c.partition("://")[2].partition("/")[0] for c in calls), \
        f"the parser split a multi-host netloc with urlsplit: {calls}"
    assert sentinel_url(list(t.sentinels), t.service, db=t.db) and parse_url(sentinel_url(list(t.sentinels),
                                                                                        t.service, db=t.db))
    r = make_redis(t)  # the factory takes it too (no connection is made)
    assert [s.connection_pool.connection_kwargs["host"] for s in r.connection_pool.sentinel_manager.sentinels] == \
        [h for h, _ in sentinels]
    r.close()


@pytest.mark.parametrize("url", ["redis://[::1]:6379/0", "redis://u:p@[2001:db8::1]:6380/3", "rediss://[::1]/0",
                                 "redis://localhost:6379/1", "unix:///run/redis/redis.sock?db=2"])
def test_the_suite_fails_on_a_fresh_debian_machine_direct_forms_parse_where_urlsplit_is_strict(
        url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import urllib.parse

    import mc_queue.store.urls as urls
    calls: list[str] = []
    strict = _strict_urlsplit(calls)
    monkeypatch.setattr(urllib.parse, "urlsplit", strict)
    monkeypatch.setattr(urls, "urlsplit", strict, raising=False)
    t = parse_url(url)
    assert not t.sentinel and t.redis_url
    make_redis(t).close()


DEBIAN_PYTHON = "/usr/bin/python3"


def test_the_suite_fails_on_a_fresh_debian_machine_ipv6_sentinel_urls_parse_under_debians_python() -> None:
    """The same forms parsed by Debian's own Python (3.11.2, whose urlsplit refuses them), when it can
    import redis-py (a venv made from it runs the whole suite there anyway)."""
    import subprocess
    import sys
    if not os.path.exists(DEBIAN_PYTHON):
        pytest.skip("no /usr/bin/python3 on this machine")
    if os.path.realpath(DEBIAN_PYTHON) == os.path.realpath(sys.executable):  # the suite runs under it: here
        strict = True
        try:
            urllib.parse.urlsplit("redis+sentinel://a:1,[::1]:2/s")
            strict = False
        except ValueError:
            pass
        for url, sentinels, service, db in README_FORMS:
            t = parse_url(url)
            assert (t.sentinels, t.service, t.db) == (sentinels, service, db), url
        print(f"parsed every README form under {sys.version.split()[0]} (its urlsplit strict: {strict})")
        return
    repo = str(Path(__file__).resolve().parents[2])
    theirs = subprocess.run([DEBIAN_PYTHON, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True,
                            text=True, timeout=30).stdout.strip()
    if theirs != str(sys.version_info[:2]):  # this venv's compiled packages (pydantic-core) are for this Python
        pytest.skip(f"{DEBIAN_PYTHON} is Python {theirs}, this suite {sys.version_info[:2]}: it cannot import this "
                    "venv's packages (a suite run under it, PYTHON=/usr/bin/python3 ./run test, checks it there)")
    site = [p for p in sys.path if p.endswith("site-packages")]
    probe = subprocess.run([DEBIAN_PYTHON, "-c", "import sys, urllib.parse as u\n"
                            "try:\n u.urlsplit('redis+sentinel://a:1,[::1]:2/s')\nexcept ValueError:\n sys.exit(7)"],
                           capture_output=True, timeout=30)
    if probe.returncode != 7:
        pytest.skip(f"{DEBIAN_PYTHON}'s urlsplit accepts a bracketed host in a multi-host netloc")
    # redis-py imports async_timeout below Python 3.11.3 (this venv's interpreter is newer and has none):
    # a stand-in module, since parsing a URL never runs asyncio.
    code = ("import sys, types; sys.path[:0] = [sys.argv[1]]\n"
            "stub = types.ModuleType('async_timeout'); stub.timeout = None\n"
            "sys.modules.setdefault('async_timeout', stub)\n"
            "from mc_queue.store.urls import parse_url\n"
            "for u in sys.argv[2:]:\n"
            "    t = parse_url(u); print(t.sentinels, t.service, t.db)\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(site)}  # redis-py from this venv (pure Python is fine)
    out = subprocess.run([DEBIAN_PYTHON, "-c", code, repo, *(f[0] for f in README_FORMS)], capture_output=True,
                         text=True, timeout=60, env=env)
    if "No module named" in out.stderr and "mc_queue" not in out.stderr.splitlines()[-1]:
        pytest.skip(f"{DEBIAN_PYTHON} cannot import this venv's packages: {out.stderr.splitlines()[-1]}")
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("\n") == len(README_FORMS)


# --------------------------------------------------------------------------- issue 15: malformed URL parts

@pytest.mark.parametrize(("url", "says"), [
    ("redis://h:99999/0", "port must be a whole number from 1 to 65535, not '99999'"),
    ("redis://h:0/0", "port must be a whole number from 1 to 65535"),
    ("redis://h:x/0", "port must be a whole number from 1 to 65535, not 'x'"),
    ("redis://h:/0", "port must be a whole number from 1 to 65535, not ''"),
    ("redis+sentinel://h:99999/m", "the port of sentinel h must be a whole number from 1 to 65535"),
    ("redis://h/x", "db must be a whole number from 0 to"),
    ("redis://h/-1", "db must be a whole number from 0 to"),
    ("redis://h/99999999999", "db must be a whole number from 0 to"),
    ("redis://h/0/1", "the path must be /db"),
    ("redis+sentinel://h/m/99999999999", "db must be a whole number from 0 to"),
    ("redis://h/0?socket_timeout=abc", "socket_timeout must be seconds"),
    ("redis://h/0?socket_timeout=nan", "socket_timeout must be seconds"),
    ("redis://h/0?socket_timeout=-1", "socket_timeout must be seconds"),
    ("redis://h/0?socket_connect_timeout=inf", "socket_connect_timeout must be seconds"),
    ("redis+sentinel://h/m?socket_timeout=abc", "socket_timeout must be seconds"),
    ("redis://h/0?socket_keepalive=maybe", "socket_keepalive must be one of"),
    ("redis://h/0?max_connections=-1", "max_connections must be a whole number"),
    ("redis://h/0?health_check_interval=x", "health_check_interval must be a whole number"),
    ("redis://h?db=x", "db must be a whole number"),
    ("redis://h/1?db=2", "db is given twice"),
    ("redis://h/0?foo=1", "unknown parameter 'foo'"),
    ("redis://h/0?retry_on_error=x", "unknown parameter 'retry_on_error'"),
    ("redis://h/0?socket_timeout=1&socket_timeout=2", "given twice"),
    ("redis://h/0?ssl_ca_certs=/x", "need rediss://"),
    ("rediss://h/0?ssl_cert_reqs=bogus", "ssl_cert_reqs must be none, optional or required"),
    ("unix:///tmp/x.sock?db=abc", "db must be a whole number"),
    ("unix://", "names no socket path"),
    ("unix:///tmp/x.sock?foo=1", "unknown parameter 'foo'"),
    ("redis://[::1/0", "unclosed '['"),
    ("redis://[zz]:1/0", "not an IPv6 address"),
    ("redis://h h:1/0", "host"),
    ("redis://h:1/0#frag", "fragment"),
    ("redis+sentinel://[::1]:1,[zz]:2/m", "not an IPv6 address"),
    ("redis+sentinel://h:1,,h2:2/m", "has no host"),
])
def test_every_malformed_url_part_is_one_clear_error(url: str, says: str) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(says)) as exc:
        parse_url(url)
    assert str(exc.value).startswith("bad Redis URL "), str(exc.value)
    with pytest.raises(ConfigurationError):
        make_redis(url)


def test_every_malformed_url_part_is_one_clear_error_and_a_good_one_passes_its_options_on() -> None:
    t = parse_url("redis://h:6380/3?socket_timeout=2.5&socket_keepalive=yes&max_connections=9&client_name=w1")
    assert t.redis_url == "redis://h:6380/3?socket_timeout=2.5&socket_keepalive=yes&max_connections=9&client_name=w1"
    kw = make_redis(t).connection_pool.connection_kwargs
    assert (kw["host"], kw["port"], kw["db"], kw["socket_timeout"], kw["socket_keepalive"]) == ("h", 6380, 3, 2.5,
                                                                                              True)


# --------------------------------------------------------------------------- issue 15: passwords in output

SECRET_HEAD, SECRET_TAIL = "Hq7SECRETx", "Zt4TAILw"
HOSTILE = ["#", "/", "?", "@", ":", "%", "&", "=", " ", "#/?@", "%zz", "@@", "ü", "/@/", "?a=1&b="]
BAD_PARTS = ["", ":99999", ":x", "/99999999999", "/x", "?socket_timeout=abc", "?foo=1", "#frag", "/0/1"]


def _hostile_urls() -> list[str]:
    urls: list[str] = []
    for mid in HOSTILE:
        pw = f"{SECRET_HEAD}{mid}{SECRET_TAIL}"
        for bad in BAD_PARTS:
            port_and_path = {"": ":6379/0", ":99999": ":99999/0", ":x": ":x/0"}.get(bad, ":6379" + (
                bad if bad.startswith("/") else "/0" + bad))
            urls += [f"redis://user:{pw}@host{port_and_path}",
                     f"redis://:{pw}@host{port_and_path}",
                     *([f"rediss://{pw}@host{port_and_path}"] if ":" not in mid else []),  # else a user name
                     f"unix://:{pw}@/tmp/r.sock{bad if bad.startswith(('?', '#')) else ''}",
                     f"redis+sentinel://u:{pw}@s1:26379,[::1]{port_and_path.replace('/0', '/svc', 1)}",
                     f"redis+sentinel://s1/svc?sentinel_password={pw}" + (bad if bad.startswith("?") else ""),
                     f"redis://host:6379/0?ssl_password={pw}"]
    return urls


def test_passwords_in_output_never_appear_in_an_error_a_redacted_url_or_a_repr() -> None:
    checked = refused = 0
    for url in _hostile_urls():
        shown: list[str] = [redacted(url)]
        try:
            t = parse_url(url)
        except ConfigurationError as exc:
            refused += 1
            shown += [str(exc), repr(exc), repr(exc.args)]
        else:
            shown += [repr(t), str(t), t.where]
            try:
                r = make_redis(t)
            except ConfigurationError as exc:
                shown += [str(exc), repr(exc)]
            else:
                shown.append(repr(r))
                r.close()
        for text in shown:
            assert SECRET_HEAD not in text and SECRET_TAIL not in text, (url, text)
        checked += 1
    assert checked == len(_hostile_urls()) and refused > checked // 2


@pytest.mark.parametrize("url", [
    "redis://:pa#ss@h:1/0", "redis://u:pa/ss@h:1/0", "redis+sentinel://:pa?ss@h:1/m", "redis://pw@h/0",
    "not a url :pw@h", "redis://[::1:pw@h", "redis://u:p@ss@h/0?x=1#y@z", "://:pw@", "redis://%zz:pw@h",
])
def test_passwords_in_output_redacted_masks_every_input(url: str) -> None:
    out = redacted(url)
    assert "pw" not in out and "pa" not in out and "ss" not in out.replace("redis+sentinel", ""), out
