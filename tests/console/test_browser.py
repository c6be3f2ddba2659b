"""The console in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright; never a
downloaded browser): every page at 1280x800 and 390x844 against a namespace holding every state (no
horizontal scrolling on a phone, no script error), a task followed from the list to its timeline, a
DLQ replay from the page, a short reason refused with the contract's message, live updates without a
reload, and a request from a non-loopback address refused without the token. Each browser opens the
address the console prints first (it carries the token, which moves into a cookie), as a person
does: every request needs the token. Screenshots of every page go to artifacts/console/."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from mc_queue.contracts.models import TaskState
from mc_queue.ops.console import Running, start

from .conftest import REASON, REPO, Story, quarantine

CHROMIUM = os.environ.get("MCQ_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
ARTIFACTS = REPO / "artifacts" / "console"
VIEWPORTS = {"desktop": (1280, 800), "phone": (390, 844)}
TOKEN = "browser-test-token-0123456789abcdef"

pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                reason=f"no chromium binary at {CHROMIUM}: apt-get install chromium chromium-driver")


def outside_address() -> str | None:
    """An address of this machine that is not loopback (the source address of its default route), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.254", 9))  # UDP connect sends nothing: it only picks the route's source address
            addr = str(s.getsockname()[0])
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@pytest.fixture(scope="module")
def console(story: Story) -> Iterator[Running]:
    running = start(story.client, host="127.0.0.1", port=0, background=True, token=TOKEN, poll_ms=400,
                    sample_interval_s=1.0)
    yield running
    running.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        yield b
        b.close()


def open_console(pg: Any, running: Running) -> None:
    """Open the address the console printed (``…/?token=…``): the token moves into a cookie and leaves
    the address bar."""
    response = pg.goto(running.token_url)
    assert response is not None and response.status == 200 and "token=" not in pg.url, pg.url


@pytest.fixture
def page(browser: Any, console: Running) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    pg = context.new_page()
    open_console(pg, console)
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    # a refused action answers 4xx on purpose (Chromium logs those as failed loads): script errors only
    pg.on("console", lambda msg: errors.append(msg.text)
          if msg.type == "error" and not msg.text.startswith("Failed to load resource") else None)
    pg.set_default_timeout(10_000)
    yield pg
    context.close()
    assert errors == [], errors


def test_every_page_at_desktop_and_phone_width(browser: Any, console: Running, story: Story) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    # the Limits page's tables with rows in them: a spend ceiling with both kinds and a breaker with fallbacks
    q = story.client
    q.spend.set("tenant:*", cost=125.5, tokens=25_000_000, per_s=3600, reason="the browser renders it")
    q.limits.set_breaker("model:openai-large-context", reason="the browser renders it")
    q.limits.set_fallbacks("model:openai-large-context", ["model:local-small", "model:other-provider"],
                           reason="the browser renders them")
    q.fairness.set_weight("tenant:acme-enterprise", 12, reason="the browser renders it")
    try:
        _every_page(browser, console, story)
        context = browser.new_context(viewport={"width": 390, "height": 844})  # what a phone shows of them
        pg = context.new_page()
        open_console(pg, console)
        pg.goto(console.url.rstrip("/") + "/limits")
        text = re.sub(r"\s+", " ", pg.inner_text("main#main"))
        context.close()
        assert "fallbacks: model:local-small, model:other-provider" in text, text
        assert "cost 125.5, tokens 25,000,000 per 1h 00m" in text, text
        assert "tenant:acme-enterprise" in text and "12 operator" in text, text
    finally:
        q.fairness.delete_weight("tenant:acme-enterprise", reason="the browser rendered it")
        q.spend.delete("tenant:*", reason="the browser rendered it")
        q.limits.delete("model:openai-large-context", reason="the browser rendered it")


def _every_page(browser: Any, console: Running, story: Story) -> None:
    pages = {"overview": "/", "tasks": "/tasks", "task-timeline": f"/tasks/{story.reconciled}",
             **{f"task-{state}": f"/tasks/{tid}" for state, tid in story.ids().items() if state != "reconciled"},
             "attention": "/attention", "dlq": "/dlq", "workers": "/workers", "limits": "/limits"}
    for label, (width, height) in VIEWPORTS.items():
        context = browser.new_context(viewport={"width": width, "height": height})
        pg = context.new_page()
        errors: list[str] = []
        pg.on("pageerror", lambda exc, errors=errors: errors.append(str(exc)))
        pg.on("console", lambda msg, errors=errors: errors.append(msg.text) if msg.type == "error" else None)
        open_console(pg, console)
        for name, path in pages.items():
            response = pg.goto(console.url.rstrip("/") + path)
            assert response is not None and response.status == 200, (name, response and response.status)
            pg.wait_for_selector("main#main")
            overflow = pg.evaluate("document.documentElement.scrollWidth - window.innerWidth")
            assert overflow <= 0, f"{name} scrolls sideways by {overflow}px at {width}px"
            pg.screenshot(path=str(ARTIFACTS / f"{name}-{width}x{height}.png"))
            if name == "task-timeline":
                pg.screenshot(path=str(ARTIFACTS / f"{name}-{width}x{height}-full.png"), full_page=True)
        context.close()
        assert errors == [], (label, errors)
    assert len(list(ARTIFACTS.glob("*-1280x800.png"))) >= len(pages)
    assert len(list(ARTIFACTS.glob("*-390x844.png"))) >= len(pages)


def test_follow_a_task_from_the_list_to_its_timeline(page: Any, console: Running, story: Story) -> None:
    page.goto(console.url + "tasks")
    page.check("input[name=state][value=blocked]")
    page.click("form.filters button[type=submit]")
    page.wait_for_url(re.compile(r"state=blocked"))
    page.click(f"a.tid:text-is('{story.reconciled}')")
    page.wait_for_url(f"**/tasks/{story.reconciled}")
    stale = page.locator("li.ev[data-type=stale_write_refused]")
    assert stale.count() == 1
    assert "presented fence 1 ≠ current fence 2" in stale.inner_text()
    assert "complete from worker-A refused" in stale.inner_text()
    reconciled = page.locator("li.ev[data-type=attempt_reconciled]")
    assert "cannot tell whether push:" in reconciled.locator(".ev-conclusion").inner_text()
    reconciled.locator("details.ev-evidence summary").click()
    evidence = reconciled.locator("details.ev-evidence pre")
    assert evidence.is_visible() and '"state": "unknown"' in evidence.inner_text()
    assert "lease of worker-A expired" in page.locator("li.ev[data-type=lease_expired]").inner_text()
    assert "Reconciliation:" in page.locator("#attempt-1").inner_text()


def test_replay_from_the_dlq_page_and_a_short_reason_refused(page: Any, console: Running, story: Story) -> None:
    tid = quarantine(story.client, "browser-replay")
    page.goto(console.url + "dlq")
    item = page.locator(f"li[data-task='{tid}']")
    item.locator("summary", has_text="Replay this task").click()
    item.locator("textarea[name=reason]").fill("too short")
    item.locator("button[type=submit]").click()
    alert = page.locator("#error")
    assert alert.inner_text() == "Replay: bad input: reason needs at least 10 characters (after trimming spaces)"
    assert story.client.reads.get_task(tid).state is TaskState.QUARANTINED
    item = page.locator(f"li[data-task='{tid}']")
    assert item.locator("textarea[name=reason]").input_value() == "too short"  # what was typed is kept
    item.locator("textarea[name=reason]").fill(REASON)
    item.locator("textarea[name=hypothesis]").fill("the plan names its base sha now")
    item.locator("button[type=submit]").click()
    page.wait_for_url(f"**/tasks/{tid}")
    assert f"{tid}/2 created (pending)" in page.locator("#flash").inner_text()
    attempt = page.locator("#attempt-2")
    assert "pending" in attempt.inner_text() and REASON in attempt.inner_text()
    assert "the plan names its base sha now" in attempt.inner_text()
    events = [e.fields for e in story.client.reads.get_task(tid).events if e.type == "dlq_replayed"]
    assert [e["actor"] for e in events] == ["console:127.0.0.1"]


def test_pages_update_without_a_reload(page: Any, console: Running, story: Story) -> None:
    tid = quarantine(story.client, "browser-live")
    page.goto(console.url + f"tasks/{tid}")
    page.evaluate("window.__sameDocument = true")
    assert page.locator("#attempt-2").count() == 0
    story.client.operator.dlq_replay(tid, "replayed from the command line meanwhile",
                                     actor="operator")  # like `mcq dlq replay`
    page.wait_for_selector("#attempt-2", timeout=5_000)
    assert page.evaluate("window.__sameDocument") is True  # swapped in place, not reloaded
    assert "replayed from the command line meanwhile" in page.locator("#timeline").inner_text()


def test_a_request_from_a_non_loopback_address_needs_the_token(browser: Any, console: Running,
                                                              story: Story) -> None:
    addr = outside_address()
    tid = quarantine(story.client, "browser-remote")
    if addr is not None:  # a real non-loopback peer: this machine's own address
        remote = start(story.client, host=addr, port=0, background=True, token=TOKEN, sampling=False)
        base, headers, actor = remote.url, {}, f"console:{addr}"
    else:  # no such address here: a loopback peer behind a proxy that forwards someone else's request
        remote, base = None, console.url
        headers, actor = {"X-Forwarded-For": "203.0.113.7"}, "console:127.0.0.1"
    context = browser.new_context(viewport={"width": 1280, "height": 800}, extra_http_headers=headers)
    try:
        pg = context.new_page()
        response = pg.goto(base + f"tasks/{tid}")
        assert response is not None and response.status == 401
        assert "needs its token" in pg.inner_text("main")
        # an action without the token: refused before any form check, nothing changes
        refused = pg.request.post(base + "actions/replay", form={"task_id": tid, "reason": REASON, "csrf": "x.y"})
        assert refused.status == 401
        assert story.client.reads.get_task(tid).state is TaskState.QUARANTINED
        # with the token (once, in the address; a cookie from then on) the same action goes through
        response = pg.goto(base + f"tasks/{tid}?token={TOKEN}")
        assert response is not None and response.status == 200 and "token=" not in pg.url
        pg.click("#actions summary")
        form = pg.locator("form[data-action=replay]")
        form.locator("textarea[name=reason]").fill(REASON)
        form.locator("button[type=submit]").click()
        pg.wait_for_selector("#attempt-2")
        events = [e.fields for e in story.client.reads.get_task(tid).events if e.type == "dlq_replayed"]
        assert [e["actor"] for e in events] == [actor]
    finally:
        context.close()
        if remote is not None:
            remote.stop()


def test_a_browser_on_this_machine_needs_the_printed_address(browser: Any, console: Running) -> None:
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        pg = context.new_page()
        response = pg.goto(console.url + "dlq")
        assert response is not None and response.status == 401 and "needs its token" in pg.inner_text("main")
        open_console(pg, console)
        assert "Namespace" in pg.inner_text("#namespace")
        pg.click("nav a[href='/dlq']")
        pg.wait_for_url("**/dlq")
        assert pg.locator("#dlq-groups").count() == 1
    finally:
        context.close()


def test_the_overview_draws_the_samples_the_console_took(page: Any, console: Running, story: Story) -> None:
    deadline = time.monotonic() + 5
    while story.client.redis.xlen(story.client.keys.queue_samples("agents")) < 2:
        assert time.monotonic() < deadline, "the console took no samples"
        time.sleep(0.2)
    page.goto(console.url)
    card = page.locator("article.queue", has=page.locator("h3", has_text="agents"))
    assert card.locator("svg path.line").count() >= 1
    assert "Attempts finished" in card.inner_text()
    assert page.locator("#namespace").inner_text().startswith("Namespace")


def test_redis_going_down_is_a_banner_on_the_open_page(browser: Any, own_redis: Any) -> None:
    import mc_queue

    client = mc_queue.connect(own_redis.url, prefix="browser-down", socket_timeout=1.0)
    running = start(client, port=0, background=True, poll_ms=300, sampling=False)
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    try:
        client.producer.enqueue("jobs", "fix-issue", {"n": 1})
        pg = context.new_page()
        open_console(pg, running)
        assert pg.locator("#banner .banner-down").count() == 0
        own_redis.stop()
        pg.wait_for_selector("#banner .banner-down", timeout=10_000)  # on the open page, without a reload
        assert "Redis cannot be reached" in pg.inner_text("#banner")
        assert "Redis unreachable" in pg.inner_text("#live-status")
        own_redis.start()
        pg.wait_for_selector("#banner .banner-down", state="detached", timeout=15_000)
        assert "jobs" in pg.inner_text("#queues")
        # a page first loaded while Redis was down becomes the page once Redis answers
        own_redis.stop()
        pg.goto(running.url + "dlq")
        assert "Redis cannot be reached" in pg.inner_text("main")
        own_redis.start()
        pg.wait_for_selector("#dlq-groups", timeout=15_000)
    finally:
        context.close()
        running.stop()
        client.close()
