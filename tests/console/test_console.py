"""The console over HTTP (Starlette's TestClient, a real redis-server): who may look and act (loopback,
token, CSRF, read-only), actions under the CLI's contract (a short reason refused with the contract's
message, the actor recorded), Redis down shown as such, no secret rendered, the samples kept in Redis."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

import mc_queue
from mc_queue.contracts.models import TaskState
from mc_queue.ops.console import create_app, start
from mc_queue.ops.console.samples import KEEP, sample
from mc_queue.ops.console.security import Guard, is_loopback_address, is_loopback_host_header
from mc_queue.testing import RedisServer, free_port, unique_prefix

from .conftest import LOCAL_URL, REASON, Story, TestClient, alert_of, csrf_of, hidden_fields, local, quarantine

TOKEN = "a-token-for-these-tests-0123456789"


@pytest.fixture(scope="module")
def app(story: Story):  # type: ignore[no-untyped-def]
    return create_app(story.client, token=TOKEN, sampling=False)


def test_every_page_renders_every_state(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    c = local(app)
    mc_queue.Sweeper(story.client).run_once()  # a pass just now: the sweeper shows as running
    overview = c.get("/").text
    assert "Namespace" in overview and "sweeper: last pass" in overview and "not running" not in overview
    listed = c.get("/tasks").text
    for tid in (story.pending, story.running, story.backoff, story.reconciled, *story.quarantined):
        assert tid in listed
    for state, tid in story.ids().items():
        r = c.get(f"/tasks/{tid}")
        assert r.status_code == 200, (state, r.text[:500])
        assert tid in r.text
    assert story.quarantined[0] in c.get("/attention").text
    dlq = c.get("/dlq").text
    groups = re.findall(r'class="card dlq-group" id="group-\d+" data-fingerprint="([0-9a-f]{16})"', dlq)
    fingerprints = story.client.reads.dlq_fingerprints()
    first, third = (next(fp for fp, ids in fingerprints.items() if tid in ids)
                    for tid in (story.quarantined[0], story.quarantined[2]))
    assert first != third and {first, third} <= set(groups)
    assert story.quarantined[1] in fingerprints[first]  # the same failure, one group
    assert "worker-7" in c.get("/workers").text  # holds the running task's lease
    story.client.limits.set("github", 5, per_s=60, reason="the console lists it")
    story.client.limits.pause("model:x", 60, reason="429 from the model provider")
    story.client.limits.set_breaker("forge", reason="the console lists it")
    story.client.limits.trip("forge", 60, reason="the forge is down for maintenance")
    limits = c.get("/limits").text
    assert "github" in limits and "5 per 1m 00s" in limits and "429 from the model provider" in limits
    assert "opened by hand: the forge is down for maintenance" in limits
    assert "No concurrency key is set" in limits and "No queue is capped" in limits
    # a concurrency key with one slot: its holder (linked to its task) and one Attempt waiting in line
    q = story.client
    q.slots.set("repo:console.app", 1, reason="the console lists it")
    held, parked = (q.producer.enqueue("agents", "fix-issue", {"slot": i}, limits={"repo:console.app": 1})
                    for i in range(2))
    lease = q.leases.claim_attempt(held.id, "worker-8", 600_000, limits=("repo:console.app",))
    with pytest.raises(mc_queue.OverLimit):
        q.leases.claim_attempt(parked.id, "worker-8", 600_000, limits=("repo:console.app",))
    limits = c.get("/limits").text
    row = re.search(r"<tr>\s*<td data-label=\"Key\"><b>repo:console\.app</b></td>(.*?)</tr>", limits, re.S)
    assert row, limits
    cells = dict(re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row.group(1), re.S))
    assert re.sub(r"<[^>]+>", "", cells["Slots"]).split() == ["1", "own,", "operator"]
    assert cells["When full"] == "wait" and ">1<" in cells["Running"] and ">1<" in cells["Waiting"]
    assert (cells["Writer fence"], cells["Claims waited"], cells["Rejected"]) == ("1", "1", "0")
    assert f'<a class="tid" href="/tasks/{held.id}">{lease.attempt_id}</a>' in cells["Holders"]
    assert "1 Attempt(s) waiting for a slot" in limits
    q.leases.complete_attempt(lease.attempt_id, lease.fence, {"ok": True}, worker_id="worker-8")
    cells = dict(re.findall(r'<td data-label="([^"]+)">(.*?)</td>',
                            c.get("/limits").text.split("<b>repo:console.app</b>")[1].split("</tr>")[0], re.S))
    # the slot returned and woke the waiter (out of the line, due now): nothing runs, nothing waits
    assert (cells["Running"], cells["Waiting"], cells["Holders"]) == ("0", "0", "none")
    # a queue cap (as `mcq caps`): its cap, the tasks not ended, the room at priority 5 (and 9), the age
    q.caps.set("capped", 3, reason="the console lists it")
    for i in range(2):
        q.producer.enqueue("capped", "fix-issue", {"cap": i})
    time.sleep(0.05)

    def cap_cells() -> tuple[str, dict[str, str]]:
        page = c.get("/limits").text
        row = re.search(r'<tr>\s*<td data-label="Queue"><a href="/tasks\?queue=capped"><b>capped</b></a></td>'
                        r"(.*?)</tr>", page, re.S)
        assert row, page
        return page, {k: re.sub(r"<[^>]+>", "", v).strip()
                      for k, v in re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row.group(1), re.S)}

    page, cells = cap_cells()
    assert "<h2>Queue caps <span class=\"hint\">1 queue(s)</span></h2>" in page
    assert (cells["Cap"], cells["Depth"], cells["Room"]) == ("3 operator", "2", "1 priority 9: 0")
    assert re.fullmatch(r"\d+ ms|\d+\.\ds", cells["Age"]), cells["Age"]
    q.producer.enqueue("capped", "fix-issue", {"cap": 2})
    with pytest.raises(mc_queue.QueueFull):
        q.producer.enqueue("capped", "fix-issue", {"cap": 3})
    page, cells = cap_cells()
    assert "1 queue(s), 1 at the cap, refusing new work" in page
    assert (cells["Depth"], cells["Room"]) == ("3", "0 priority 9: 0")
    assert '<span class="chip st-failed">0</span>' in page.split("<b>capped</b>")[1].split("</tr>")[0]
    assert cells["Bytes"] == "-"  # no cap by bytes
    # a cap by bytes of payload too (as `mcq caps set-bytes`): the payload bytes of its tasks not ended
    rows, _ = q.reads.list_tasks(queue="capped")
    payloads = sum(q.redis.hstrlen(q.keys.task(r["task_id"]).task, "payload") for r in rows)
    assert q.caps.set_bytes("capped", payloads + 10, reason="the console lists it")
    page, cells = cap_cells()
    assert cells["Bytes"] == f"{payloads:,} of {payloads + 10:,}", cells
    assert q.caps.delete("capped", reason="the console listed it")
    page, cells = cap_cells()  # capped by bytes alone: still listed
    assert (cells["Cap"], cells["Room"], cells["Bytes"]) == ("-", "-", f"{payloads:,} of {payloads + 10:,}")
    assert q.caps.delete_bytes("capped", reason="the console listed it")
    assert "No queue is capped" in c.get("/limits").text
    # a spend ceiling (as `mcq spend`): its ceiling, what was spent and reserved, the claims it deferred
    assert "No spend ceiling is set" in c.get("/limits").text
    q.spend.set("tenant:console", cost=1.0, per_s=3600, reason="the console lists it")
    ta, tb = (q.producer.enqueue("agents", "fix-issue", {"spend": i}, limits={"tenant:console": 0},
                                 budget=mc_queue.Budget(max_cost=0.5)) for i in range(2))
    la = q.leases.claim_attempt(ta.id, "worker-8", 600_000, limits=("tenant:console",))
    q.leases.complete_attempt(la.attempt_id, la.fence, {"ok": True}, worker_id="worker-8", cost=0.75)
    with pytest.raises(mc_queue.OverLimit):
        q.leases.claim_attempt(tb.id, "worker-8", 600_000, limits=("tenant:console",))
    page = c.get("/limits").text
    row = page.split("<b>tenant:console</b>")[1].split("</tr>")[0]
    cells = {k: re.sub(r"<[^>]+>", "", v).strip() for k, v in re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row,
                                                                          re.S)}
    assert cells["Ceiling"] == "cost 1 per 1h 00m operator, wait when over", cells
    assert (cells["Spent"], cells["Reserved"], cells["Claims"]) == ("0.75", "0 0 running", "1 deferred, 0 rejected")
    assert "1 key(s)</span>" in page
    # a fairness key (as `mcq fair`): its weight and where it comes from, its messages in each fair lane
    assert "No task names a fairness key" in c.get("/limits").text
    q.fairness.set_weight("tenant:*", 3, reason="the console lists it")
    q.runner.run("fair_push", {"lanes": q.keys.fair_lanes("agents", 2), "turns": q.keys.fair_turns("agents", 2)},
                 {"lane": "tenant:console", "job_id": "mcq-console-1"})
    page = c.get("/limits").text
    rows = page.split('<table class="fair">')[1].split("</table>")[0]
    row = rows.split("<b>tenant:console</b>")[1].split("</tr>")[0]
    cells = {k: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", v)).strip()
             for k, v in re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row, re.S)}
    assert cells == {"Weight": "3 operator", "Queued": "1 in agents@p2", "Not ended": "0"}, cells
    assert "2 key(s), 1 with messages queued</span>" in page
    # a key's cap and cap by bytes (as `mcq fair`): its tasks not ended against them
    q.caps.set_key("tenant:capped", 1, reason="the console lists it")
    q.caps.set_bytes("@tenant:capped", 1000, reason="the console lists it")
    q.producer.enqueue("agents", "fix-issue", {"fair": 1}, fair_key="tenant:capped")
    page = c.get("/limits").text
    row = page.split('<table class="fair">')[1].split("<b>tenant:capped</b>")[1].split("</tr>")[0]
    cells = {k: re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", v)).strip()
             for k, v in re.findall(r'<td data-label="([^"]+)">(.*?)</td>', row, re.S)}
    assert cells["Not ended"] == "1 cap 1 10 of 1,000 bytes", cells  # ({"fair":1}: 10 bytes)
    assert '<span class="chip st-failed">1</span>' in row
    assert c.get("/healthz").text == "ok"


def test_a_task_page_shows_its_priority_deadlines_and_periodic_tick(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    from datetime import timedelta

    from mc_queue.contracts.periodic import PeriodicSchedule

    urgent = q.producer.enqueue("agents", "fix-issue", {"n": "urgent"}, priority=1, start_by=timedelta(hours=1))
    q.periodic.publish(PeriodicSchedule(name="nightly", handler="fix-issue", queue="agents", every_s=60))
    q.redis.hset(q.keys.periodic_state("nightly"), "cursor", q.backend.redis_time_ms() - 61_000)
    ticked = next(t for t in q.periodic.run_due() if t.outcome == "ran")
    c = local(app)
    html = c.get(f"/tasks/{urgent.id}").text
    assert "<dt>priority</dt><dd>1 (1 most urgent, 5 default)</dd>" in html
    assert "<dt>deadlines</dt><dd>start by " in html and "(in 59m " in html
    html = c.get(f"/tasks/{ticked.task_id}").text
    assert "(periodic schedule nightly, tick " in html
    plain = c.get(f"/tasks/{story.pending}").text
    assert "<dt>priority</dt>" not in plain and "<dt>deadlines</dt>" not in plain


def test_a_waiting_task_page_links_its_parents_and_offers_cancel(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    parent = q.producer.enqueue("agents", "fix-issue", {"n": "parent"})
    child = q.producer.enqueue("agents", "fix-issue", {"n": "child"}, after=[parent.id])
    c = local(app)
    html = c.get(f"/tasks/{child.id}").text
    assert f'<a href="/tasks/{parent.id}"><code>{parent.id}</code></a> (waiting)' in html
    assert "(each must succeed)" in html and 'action="/actions/cancel"' in html
    assert f'<a href="/tasks/{child.id}"><code>{child.id}</code></a>' in c.get(f"/tasks/{parent.id}").text
    assert child.id in c.get("/tasks?state=waiting").text


def test_the_timeline_shows_the_refused_stale_write_and_the_reconciliation(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    html = local(app).get(f"/tasks/{story.reconciled}").text
    assert "stale write refused" in html
    assert re.search(r"presented fence <b>1</b> &ne; current fence <b>2</b>", html)
    assert "attempt reconciled" in html and "cannot tell whether push:" in html  # the evidence's conclusion
    assert "workspace_prepared" in html  # the phase reached


def test_the_rq_job_description_names_handler_task_and_attempt(story: Story) -> None:
    assert story.job_description == f"noop task {story.succeeded} attempt 1"


def test_task_list_filters_paging_and_bad_input(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    c = local(app)
    only = c.get("/tasks", params={"state": "quarantined"}).text
    assert all(t in only for t in story.quarantined) and story.pending not in only
    assert story.running in c.get("/tasks", params={"handler": "fix-issue", "state": "running"}).text
    assert story.pending not in c.get("/tasks", params={"older_than": "1h"}).text
    bad = c.get("/tasks", params={"older_than": "soon"})
    assert bad.status_code == 400 and "is not a duration" in alert_of(bad.text)
    bad = c.get("/tasks", params={"state": "nonsense"})
    assert bad.status_code == 400 and "in no index" in alert_of(bad.text)
    assert c.get("/tasks", params={"page": "0"}).status_code == 400
    go = c.get("/go", params={"id": story.succeeded}, follow_redirects=False)
    assert go.status_code == 303 and go.headers["location"] == f"/tasks/{story.succeeded}"
    assert c.get("/go", params={"id": "not a task"}).status_code == 400
    assert c.get("/tasks/jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV").status_code == 404


def test_loopback_rules() -> None:
    for host in ("127.0.0.1", "127.0.0.2", "127.255.0.9", "::1", "::ffff:127.0.0.1", "[::1]"):
        assert is_loopback_address(host), host
    for host in ("10.0.0.1", "192.0.2.2", "::ffff:10.0.0.1", "localhost", "testclient", "", None, "0.0.0.0"):
        assert not is_loopback_address(host), host
    for header in ("127.0.0.1:9465", "localhost:9465", "[::1]:9465", "127.0.0.2", "LOCALHOST"):
        assert is_loopback_host_header(header), header
    for header in ("evil.example:9465", "192.0.2.2:9465", "", None, "localhost.evil.example"):
        assert not is_loopback_host_header(header), header
    with pytest.raises(ValueError, match="at least 16"):
        Guard(token="short")


def test_requests_not_from_this_machine_need_the_token(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    remote = TestClient(app, client=("192.0.2.10", 50000), base_url="http://192.0.2.2:9465")
    r = remote.get("/")
    assert r.status_code == 401 and "needs its token" in r.text and story.prefix not in r.text
    assert remote.get("/", params={"token": "wrong-token-0123456789"}).status_code == 401
    assert remote.get("/static/console.css").status_code == 401
    assert remote.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # ?token= once: a cookie from then on, and the token leaves the address bar
    r = remote.get("/tasks", params={"token": TOKEN, "state": "running"}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/tasks?state=running"
    assert "mcq_token=" in r.headers["set-cookie"] and "HttpOnly" in r.headers["set-cookie"]
    assert remote.get("/tasks?state=running").status_code == 200
    # a loopback peer is not enough: a proxy on this machine relays anyone from 127.0.0.1 (test_proxy.py)
    assert local(app, token=False).get("/").status_code == 401
    assert local(app, token=False, headers={"X-Forwarded-For": "203.0.113.7"}).get("/").status_code == 401


def test_trust_loopback_lets_local_requests_in_and_nothing_else(story: Story) -> None:
    app = create_app(story.client, token=TOKEN, sampling=False, trust_loopback=True)
    assert local(app, token=False).get("/").status_code == 200
    assert TestClient(app, client=("127.0.0.2", 1), base_url="http://127.0.0.2:9465").get("/").status_code == 200
    assert TestClient(app, client=("::1", 1), base_url="http://[::1]:9465").get("/").status_code == 200
    # not behind a proxy that says so, nor under another site's name (DNS rebinding), nor from elsewhere
    assert local(app, token=False, headers={"X-Forwarded-For": "203.0.113.7"}).get("/").status_code == 401
    rebound = TestClient(app, client=("127.0.0.1", 40101), base_url="http://evil.example:9465")
    assert rebound.get("/").status_code == 401
    remote = TestClient(app, client=("192.0.2.10", 50000), base_url="http://192.0.2.2:9465")
    assert remote.get("/").status_code == 401
    assert remote.get("/", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_an_action_from_a_non_loopback_origin_without_token_is_refused(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    victim = quarantine(story.client, "remote-refusal")
    page = local(app).get(f"/tasks/{victim}").text
    remote = TestClient(app, client=("192.0.2.10", 50000), base_url="http://192.0.2.2:9465")
    r = remote.post("/actions/replay", data={"csrf": csrf_of(page), "task_id": victim, "reason": REASON,
                                             "page": "task"})
    assert r.status_code == 401
    assert story.client.reads.get_task(victim).state is TaskState.QUARANTINED


def test_forms_need_the_console_s_csrf_token(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    victim = quarantine(story.client, "csrf")
    c = local(app)
    page = c.get(f"/tasks/{victim}").text
    token = csrf_of(page)
    form = {"task_id": victim, "reason": REASON, "page": "task"}
    for data, headers, cookies in (
        (form, {}, None),                                               # no field
        ({**form, "csrf": token + "x"}, {}, None),                      # a field not signed by the console
        ({**form, "csrf": token}, {}, {"mcq_csrf": "another-nonce-abcdefgh"}),  # another page's cookie
        ({**form, "csrf": token}, {"Origin": "http://evil.example"}, None),     # a cross-site form
    ):
        other = local(app)
        other.cookies.update(dict(c.cookies))
        if cookies:
            other.cookies.update(cookies)
        r = other.post("/actions/replay", data=data, headers=headers)
        assert r.status_code == 403 and "CSRF" in r.text, r.text[:300]
    assert story.client.reads.get_task(victim).state is TaskState.QUARANTINED
    r = c.post("/actions/replay", data={**form, "csrf": token}, headers={"Origin": LOCAL_URL})
    assert r.status_code == 200 and "replayed from the dead-letter queue" in r.text
    assert story.client.reads.get_task(victim).state is TaskState.PENDING


def test_actions_follow_the_cli_contract_and_record_the_actor(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    c = local(app)
    victim = quarantine(q, "contract")
    csrf = csrf_of(c.get("/dlq").text)
    # too short: the Client's own check (dlq_replay, cancel) or the script's (retry), its message on the page
    r = c.post("/actions/replay", data={"csrf": csrf, "task_id": victim, "reason": "too short", "page": "dlq"})
    assert r.status_code == 400
    assert alert_of(r.text) == "Replay: bad input: reason needs at least 10 characters (after trimming spaces)"
    assert 'too short</textarea>' in r.text  # what was typed is kept
    assert q.reads.get_task(victim).state is TaskState.QUARANTINED
    r = c.post("/actions/retry", data={"csrf": csrf, "task_id": story.failed, "reason": "short", "page": "task"})
    assert r.status_code == 409
    assert alert_of(r.text) == (f"Retry: refused: retry of {story.failed} refused: a retry needs a recorded reason "
                                "of at least ten characters")
    r = c.post("/actions/cancel", data={"csrf": csrf, "task_id": story.pending, "reason": "no", "page": "task"})
    assert r.status_code == 400 and "at least 10 characters" in alert_of(r.text)
    # Mission Control's rules: no retry of a quarantined task (replay is the way), with the contract's words
    r = c.post("/actions/retry", data={"csrf": csrf, "task_id": victim, "reason": REASON, "page": "attention"})
    assert r.status_code == 409 and alert_of(r.text).startswith("Retry: refused: ")
    # purge needs the confirmation
    r = c.post("/actions/purge", data={"csrf": csrf, "task_id": victim, "reason": REASON, "page": "dlq"})
    assert r.status_code == 400 and "tick the confirmation" in alert_of(r.text)
    # done: the actor is the console and the peer's address
    r = c.post("/actions/replay", data={"csrf": csrf, "task_id": victim, "reason": REASON,
                                        "hypothesis": "the plan names the base sha now", "page": "dlq"})
    assert r.status_code == 200 and f"{victim}/2 created (pending)" in r.text
    replayed = [e for e in q.reads.get_task(victim).events if e.type == "dlq_replayed"]
    assert [(e.fields["actor"], e.fields["reason"]) for e in replayed] == [("console:127.0.0.1", REASON)]
    other = quarantine(q, "contract-purge")
    r = c.post("/actions/purge", data={"csrf": csrf, "task_id": other, "reason": REASON, "confirm": "yes",
                                       "keep_days": "1", "page": "dlq"})
    assert r.status_code == 200 and f"{other} purged (1 attempt(s))" in r.text
    assert (q.reads.tombstone(other) or {}).get("reason") == REASON
    r = c.post("/actions/cancel", data={"csrf": csrf, "task_id": story.pending, "reason": REASON, "page": "task"})
    assert r.status_code == 200 and f"{story.pending}: canceled" in r.text
    story.pending = q.producer.enqueue("agents", "fix-issue", {"repo": "example/app",
                                                               "issue": 11}).id  # for later tests


def test_a_group_replay_by_fingerprint(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    ids = [quarantine(q, "group-replay"), quarantine(q, "group-replay")]
    fp = next(fp for fp, members in q.reads.dlq_fingerprints().items() if ids[0] in members)
    c = local(app)
    fields = hidden_fields(c.get("/dlq").text, "replay-group", within=f'data-fingerprint="{fp}"')
    assert fields["ids"].split() == ids and fields["count"] == "2"
    r = c.post("/actions/replay", data={**fields, "reason": REASON})
    assert r.status_code == 200 and f"replayed 2 of the 2 task(s) shown with fingerprint {fp}" in r.text
    assert all(q.reads.get_task(t).state is TaskState.PENDING for t in ids)
    r = c.post("/actions/replay", data={**fields, "fingerprint": "0" * 16, "reason": REASON})
    assert r.status_code == 400 and "no quarantined task" in alert_of(r.text)


def test_read_only_shows_no_form_and_refuses_actions(story: Story) -> None:
    app = create_app(story.client, read_only=True, sampling=False)
    c = local(app)
    for path in ("/", "/tasks", f"/tasks/{story.quarantined[0]}", f"/tasks/{story.failed}", "/attention", "/dlq"):
        html = c.get(path).text
        assert 'method="post"' not in html, path
        assert "read-only" in html
    nonce = "n" * 24
    c.cookies.set("mcq_csrf", nonce)
    csrf = app.state.console.guard.csrf_field(nonce)
    r = c.post("/actions/replay", data={"csrf": csrf, "task_id": story.quarantined[0], "reason": REASON})
    assert r.status_code == 403 and "read-only" in r.text
    assert story.client.reads.get_task(story.quarantined[0]).state is TaskState.QUARANTINED


def test_redis_down_is_a_banner_and_no_secret_is_rendered(tmp_path: Path) -> None:
    url = f"redis://:s3cret-pass-word@127.0.0.1:{free_port()}/0"
    client = mc_queue.Client(url, prefix="down", socket_timeout=1.0)
    try:
        app = create_app(client, sampling=False)
        c = local(app)
        for path in ("/", "/tasks", "/tasks/jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV", "/attention", "/dlq", "/workers",
                     "/limits", "/?partial=1"):
            r = c.get(path)
            assert r.status_code == 503, (path, r.status_code)
            assert "Redis cannot be reached" in r.text
            assert "s3cret" not in r.text and "redis://:***@127.0.0.1" in r.text
        nonce = "m" * 24
        c = local(app)  # a browser that holds the token and this page's CSRF cookie, nothing else
        c.cookies.set("mcq_csrf", nonce)
        r = c.post("/actions/cancel", data={"csrf": app.state.console.guard.csrf_field(nonce),
                                            "task_id": "jobs:01ARZ3NDEKTSV4RRFFQ69G5FAV", "reason": REASON})
        assert r.status_code == 503 and "Redis cannot be reached" in r.text
    finally:
        client.close()


def test_redis_going_away_and_coming_back(own_redis: RedisServer) -> None:
    client = mc_queue.connect(own_redis.url, prefix="flaky", socket_timeout=2.0)
    try:
        client.producer.enqueue("jobs", "h", {"n": 1})
        c = local(create_app(client, sampling=False))
        assert c.get("/").status_code == 200
        own_redis.stop()
        r = c.get("/")
        assert r.status_code == 503 and "Redis cannot be reached" in r.text
        own_redis.start()
        assert c.get("/").status_code == 200
    finally:
        client.close()


def test_queue_samples_are_capped_kept_in_redis_and_drawn(story: Story, redis_server: RedisServer) -> None:
    """The test alone samples its namespace (no console's sampler runs on it: it once raced a console
    sampling the shared story namespace, issue 15); one such console samples the story meanwhile."""
    story_key = story.client.keys.queue_samples("agents")
    before = story.client.redis.xrevrange(story_key, count=1)
    racer = start(story.client, host="127.0.0.1", port=0, background=True, token=TOKEN, sample_interval_s=0.001)
    q = mc_queue.connect(redis_server.url, prefix=unique_prefix("samples"))
    try:
        deadline = time.monotonic() + 10
        while story.client.redis.xrevrange(story_key, count=1) == before:  # the racer is sampling
            assert time.monotonic() < deadline, "the racing console took no sample"
            time.sleep(0.01)
        for queue in ("agents", "other"):
            q.producer.enqueue(queue, "fix-issue", {"queue": queue})
        key = q.keys.queue_samples("agents")
        assert sample(q, interval_s=10) == 2  # every queue of the namespace
        assert sample(q, interval_s=10) == 0  # another console sampled less than an interval ago: skipped
        assert sample(q, interval_s=0) == 2
        entries = q.redis.xrange(key)
        assert len(entries) == 2
        assert set(entries[0][1]) == {"age_ms", "depth", "running", "succeeded", "failed", "canceled"}
        for _ in range(KEEP + 5):
            q.redis.xadd(key, {"age_ms": 1000, "depth": 1, "running": 0, "succeeded": 0, "failed": 0,
                               "canceled": 0}, maxlen=KEEP, approximate=False)
        assert q.redis.xlen(key) == KEEP
        # a console started afresh draws what Redis kept
        html = local(create_app(q, sampling=False)).get("/").text
        assert re.search(r'<path class="line" d="M[0-9.]+,[0-9.]+ L', html)
        assert "Attempts finished" in html
        assert q.redis.xlen(key) == KEEP  # and sampled nothing of its own
    finally:
        racer.stop()
        q.close()


def test_every_response_carries_the_security_headers(app) -> None:  # type: ignore[no-untyped-def]
    r = local(app).get("/")
    assert "default-src 'self'" in r.headers["content-security-policy"]
    assert r.headers["x-frame-options"] == "DENY"
    assert r.headers["cache-control"] == "no-store"
    cookie = r.headers.get("set-cookie", "")
    assert "mcq_csrf=" in cookie and "HttpOnly" in cookie and "SameSite=strict" in cookie


def test_a_lost_namespace_says_so_with_the_way_out(redis_server: RedisServer) -> None:
    client = mc_queue.connect(redis_server.url, prefix=f"lost-{free_port()}")
    try:
        client.producer.enqueue("jobs", "h", {"n": 1})
        client.redis.delete(client.keys.meta)  # Redis lost the namespace's record (a flush, a restart without data)
        html = local(create_app(client, sampling=False)).get("/").text
        assert 'class="card ns-card ns-lost"' in html
        assert f"mcq --prefix {client.keys.prefix} recover" in html
    finally:
        client.close()
    fresh = mc_queue.connect(redis_server.url, prefix=f"fresh-{free_port()}")
    try:
        c = local(create_app(fresh, sampling=False))
        assert "No namespace yet" in c.get("/").text  # read only: the console creates nothing
        for path in ("/tasks", "/attention", "/dlq", "/workers", "/limits"):
            assert c.get(path).status_code == 200, path
        assert fresh.redis.exists(fresh.keys.meta) == 0
    finally:
        fresh.close()


def test_pages_of_the_task_list_and_a_paused_queue(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    ids = [q.producer.enqueue("many", "fix-issue", {"n": i}).id for i in range(27)]
    c = local(app)
    first = c.get("/tasks", params={"queue": "many"}).text
    assert sum(t in first for t in ids) == 25 and ids[0] in first  # oldest first
    assert 'href="/tasks?queue=many&amp;page=2"' in first
    second = c.get("/tasks", params={"queue": "many", "page": "2"}).text
    assert sum(t in second for t in ids) == 2 and ids[-1] in second and "page=3" not in second
    assert q.operator.pause_queue("many", reason="the provider asked us to slow down", actor="operator")
    try:
        html = c.get("/").text
        assert "Paused by operator: the provider asked us to slow down" in html
    finally:
        q.operator.resume_queue("many", reason="the provider is fine again", actor="operator")


def _fingerprint_of(q: mc_queue.Client, task_id: str) -> str:
    return next(fp for fp, members in q.reads.dlq_fingerprints().items() if task_id in members)


def _flash(response) -> str:  # type: ignore[no-untyped-def]
    m = re.search(r'id="flash">([^<]+)<', response.text)
    return m.group(1).replace("&#39;", "'") if m else ""


def _shown_then_grown(c: TestClient, q: mc_queue.Client, message: str,
                      action: str) -> tuple[list[str], str, dict[str, str], str]:
    """Two tasks of one group shown on the DLQ page, the group's ``action`` form as the page has it,
    then a third task quarantined in that group after the page was shown."""
    seen = [quarantine(q, message), quarantine(q, message)]
    fp = _fingerprint_of(q, seen[0])
    html = c.get("/dlq").text
    assert f"{action.split('-')[0].capitalize()} all 2" in html
    fields = hidden_fields(html, action, within=f'data-fingerprint="{fp}"')
    newcomer = quarantine(q, message)  # quarantined after the page was shown, in the same group
    return seen, fp, fields, newcomer


def test_purge_all_acts_on_the_tasks_the_operator_saw(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    c = local(app)
    seen, fp, fields, newcomer = _shown_then_grown(c, q, "purge-what-was-seen", "purge-group")
    assert set(q.reads.dlq_fingerprints()[fp]) == {*seen, newcomer}
    r = c.post("/actions/purge", data={**fields, "reason": REASON, "confirm": "yes", "keep_days": "1"})
    assert r.status_code == 200, alert_of(r.text)
    assert all(q.reads.tombstone(t) for t in seen)
    assert q.reads.get_task(newcomer).state is TaskState.QUARANTINED and q.reads.tombstone(newcomer) is None
    assert q.reads.dlq_fingerprints()[fp] == [newcomer]
    said = _flash(r)
    assert f"purged 2 of the 2 task(s) shown with fingerprint {fp}" in said
    assert "1 task quarantined since the page was shown was left alone" in said


def test_replay_all_acts_on_the_tasks_the_operator_saw(app, story: Story) -> None:  # type: ignore[no-untyped-def]
    q = story.client
    c = local(app)
    seen, fp, fields, newcomer = _shown_then_grown(c, q, "replay-what-was-seen", "replay-group")
    q.operator.dlq_replay(seen[1], "replayed from the command line meanwhile", actor="operator")  # gone from the group
    r = c.post("/actions/replay", data={**fields, "reason": REASON})
    assert r.status_code == 200, alert_of(r.text)
    assert q.reads.get_task(seen[0]).state is TaskState.PENDING
    assert len(q.reads.get_task(seen[1]).attempts) == 2  # replayed once (by the command line), not twice
    assert q.reads.get_task(newcomer).state is TaskState.QUARANTINED
    said = _flash(r)
    assert f"replayed 1 of the 2 task(s) shown with fingerprint {fp}" in said
    assert "1 had left the group" in said and "1 task quarantined since the page was shown was left alone" in said
    # every task shown has left the group since: refused, nothing changes
    r = c.post("/actions/replay", data={**fields, "reason": REASON})
    assert r.status_code == 400 and "none of the 2 task(s) shown" in alert_of(r.text)
    assert q.reads.get_task(newcomer).state is TaskState.QUARANTINED
    # a group form that lists no task (an old page, a hand-made form) is refused
    r = c.post("/actions/replay", data={"csrf": fields["csrf"], "fingerprint": fp, "page": "dlq", "reason": REASON})
    assert r.status_code == 400 and "reload the page" in alert_of(r.text)
    assert q.reads.get_task(newcomer).state is TaskState.QUARANTINED
