"""The console's web app (Starlette): pages, live fragments, the actions, and the rules around them.

Routes (every one behind :class:`~mc_queue.ops.console.security.Guard`: the token, unless the operator trusts loopback):

==========================  =====================================================================
GET  /                      overview: namespace state, per queue depth, age (now and the last hour),
                            throughput and failure rate, paused; leases, suspects, attention, DLQ,
                            sweeper, workers
GET  /tasks                 unfinished tasks from the indexes (queue, state, handler, age; pages)
GET  /tasks/{task_id}       one task's whole story: Attempts, effects, budget, every event
GET  /attention             tasks stopped for a person, with retry / replay / cancel
GET  /dlq                   the dead-letter queue by failure fingerprint, with replay and purge
GET  /workers               workers alive or dead, their queues, leases and last heartbeat
GET  /healthz               "ok" (the console answers; Redis is not asked)
POST /actions/{name}        retry | cancel | replay | purge (CSRF token, never in read-only mode)
==========================  =====================================================================

Any page with ``?partial=1`` returns its ``<main>`` only: ``static/console.js`` polls that every
few seconds and swaps the regions marked ``data-live`` (a region being edited is left alone).
A Redis that cannot be reached gives the page with a banner saying so (HTTP 503), never a 500.
Actions call the same Client methods as ``mcq retry``, ``mcq cancel``, ``mcq dlq replay`` and
``mcq dlq purge``, with the actor ``console:<peer address>``; a refusal is shown on the page with
the contract's own message.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import jinja2
import redis
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware, RequestResponseEndpoint
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ...client import Client
from ...client.reads import LISTABLE_STATES
from ...contracts.errors import InvalidArgument, McqError, NamespaceLost, TaskNotFound
from ...contracts.keys import parse_task_id
from ...contracts.models import TaskState
from ..render import duration
from . import pages
from .samples import INTERVAL_S, sample
from .security import CSRF_COOKIE, FLASH_COOKIE, TOKEN_COOKIE, Guard, cookie_kwargs, local_path

__all__ = ["Console", "create_app", "local_path"]

log = logging.getLogger("mc_queue.console")
HERE = Path(__file__).resolve().parent
POLL_MS = 5000
ACTIONS = ("retry", "cancel", "replay", "purge")
CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; form-action 'self'; "
       "frame-ancestors 'none'; base-uri 'none'; object-src 'none'")
REDIS_DOWN = (redis.ConnectionError, redis.TimeoutError)


class Console:
    """One console over one namespace: its Client, its Guard, its templates, its sampler."""

    def __init__(self, client: Client, guard: Guard, *, sample_interval_s: float = INTERVAL_S,
                 sampling: bool = True, poll_ms: int = POLL_MS) -> None:
        self.client = client
        self.guard = guard
        self.sample_interval_s = sample_interval_s
        self.sampling = sampling
        self.poll_ms = poll_ms
        self.env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(HERE / "templates")),
                                      autoescape=True, undefined=jinja2.StrictUndefined,
                                      trim_blocks=True, lstrip_blocks=True)
        self.env.globals.update(duration=duration, bytes=_bytes, listable=list(LISTABLE_STATES),
                                unlisted=[s.value for s in TaskState if s.value not in LISTABLE_STATES])
        self.last_sample_error: str | None = None

    # ------------------------------------------------------------------ rendering

    def nonce(self, request: Request) -> tuple[str, bool]:
        """The page's CSRF nonce: the cookie's, or a new one (True: set the cookie)."""
        current = request.cookies.get(CSRF_COOKIE, "")
        if 16 <= len(current) <= 64 and current.replace("-", "").replace("_", "").isalnum():
            return current, False
        return self.guard.new_nonce(), True

    def nav_counts(self) -> dict[str, int | None]:
        try:
            pipe = self.client.redis.pipeline(transaction=False)
            pipe.hlen(self.client.keys.attention)
            pipe.zcard(self.client.keys.dlq)
            attention, dlq = pipe.execute()
            return {"attention": int(attention), "dlq": int(dlq)}
        except REDIS_DOWN:
            return {"attention": None, "dlq": None}

    def render(self, request: Request, template: str, context: Mapping[str, Any], *, status: int = 200,
               title: str = "", error: str | None = None, redis_down: str | None = None,
               form: Mapping[str, str] | None = None, page_url: str | None = None) -> HTMLResponse:
        """Render a page. ``page_url``: the page's own address when it answers a POST (a refused action):
        the script polls that one and puts it in the address bar."""
        nonce, fresh = self.nonce(request)
        partial = request.query_params.get("partial") == "1"
        flash = None if partial else self.guard.read_flash(request.cookies.get(FLASH_COOKIE))
        ctx = {
            **context, "layout": "bare.html" if partial else "base.html", "title": title,
            "prefix": self.client.keys.prefix, "where": self.client.target.where,
            "read_only": self.guard.read_only, "csrf": self.guard.csrf_field(nonce), "error": error,
            "flash": flash, "redis_down": redis_down, "form": dict(form or {}),
            "path": (page_url or request.url.path).split("?", 1)[0],
            "page_url": page_url or _without_partial(request),
            "poll_ms": self.poll_ms,
            "nav": {"attention": None, "dlq": None} if redis_down else self.nav_counts(),
            "local": getattr(request.state, "local", False),
        }
        html = self.env.get_template(template).render(ctx)
        response = HTMLResponse(html, status_code=status)
        response.headers["Cache-Control"] = "no-store"
        if fresh:
            response.set_cookie(CSRF_COOKIE, nonce, **cookie_kwargs())
        if flash is not None:
            response.delete_cookie(FLASH_COOKIE, path="/")
        return response

    def down(self, request: Request, exc: BaseException, template: str = "down.html") -> HTMLResponse:
        why = f"{type(exc).__name__}: {exc}"
        return self.render(request, template, {}, status=503, title="Redis unreachable",
                           redis_down=f"Redis cannot be reached ({why[:300]}). What is shown is not current; "
                                      "the page retries by itself.")

    # ------------------------------------------------------------------ pages

    def page(self, request: Request, template: str, title: str, read: Callable[[], dict[str, Any]], *,
             error: str | None = None, status: int = 200, form: Mapping[str, str] | None = None,
             page_url: str | None = None) -> Response:
        try:
            context = read()
        except REDIS_DOWN as exc:
            return self.down(request, exc)
        except TaskNotFound as exc:
            return self.render(request, "message.html", {"heading": "No such task", "message": exc.message},
                               status=404, title="No such task")
        except InvalidArgument as exc:
            return self.render(request, "message.html", {"heading": "Bad input", "message": exc.message},
                               status=400, title="Bad input")
        except Exception as exc:  # a bug or a record this console cannot read: said on the page, and logged
            log.exception("console: %s failed", request.url.path)
            return self.render(request, "message.html", {
                "heading": "This page could not be read",
                "message": f"{type(exc).__name__}: {str(exc)[:500]} (the console's log has the traceback)"},
                status=500, title="Error")
        if context.get("bad_input"):  # the page's own input was refused: shown above what could be read
            error, status = context["bad_input"], 400
        return self.render(request, template, context, status=status, title=title, error=error, form=form,
                           page_url=page_url)

    def overview(self, request: Request) -> Response:
        params = {"page": request.query_params.get("page", "")}
        return self.page(request, "overview.html", "Overview", lambda: pages.overview(self.client, params))

    def tasks(self, request: Request) -> Response:
        params: dict[str, Any] = {k: request.query_params.get(k, "") for k in
                                  ("queue", "handler", "older_than", "since", "page")}
        params["states"] = request.query_params.getlist("state")

        def read() -> dict[str, Any]:
            try:
                return pages.task_list(self.client, params)
            except InvalidArgument as exc:  # a filter the indexes cannot answer: said above the empty list
                return {**pages.empty_task_list(self.client, params), "bad_input": f"Bad filter: {exc.message}"}

        return self.page(request, "tasks.html", "Tasks", read)

    def task(self, request: Request, *, error: str | None = None, status: int = 200,
             form: Mapping[str, str] | None = None, task_id: str | None = None) -> Response:
        tid = task_id or request.path_params["task_id"]
        return self.page(request, "task.html", f"Task {tid}", lambda: pages.task_page(self.client, tid),
                         error=error, status=status, form=form, page_url=f"/tasks/{tid}" if task_id else None)

    def attention(self, request: Request, *, error: str | None = None, status: int = 200,
                  form: Mapping[str, str] | None = None) -> Response:
        return self.listing(request, "attention.html", "Attention", "/attention", pages.attention, error=error,
                            status=status, form=form)

    def dlq(self, request: Request, *, error: str | None = None, status: int = 200,
            form: Mapping[str, str] | None = None) -> Response:
        return self.listing(request, "dlq.html", "Dead-letter queue", "/dlq", pages.dlq, error=error, status=status,
                            form=form)

    def listing(self, request: Request, template: str, title: str, path: str,
                read: Callable[[Client, dict[str, Any]], dict[str, Any]], *, error: str | None, status: int,
                form: Mapping[str, str] | None) -> Response:
        """A paged page with forms: the page asked for in the address or, answering a refused form, the
        one the form was sent from (its ``list_page``), whose address the script then polls."""
        if form is None:
            page, own = request.query_params.get("page", ""), None
        else:
            page = form.get("list_page", "")
            own = path + (f"?page={page}" if page.isdigit() and page != "1" else "")
        return self.page(request, template, title, lambda: read(self.client, {"page": page}), error=error,
                         status=status, form=form, page_url=own)

    def go(self, request: Request) -> Response:
        """The "open a task by id" box: to the task's page, or say what a task id looks like."""
        tid = request.query_params.get("id", "").strip()
        try:
            parse_task_id(tid)
        except ValueError as exc:
            return self.render(request, "message.html", {"heading": "Bad input", "message": str(exc)}, status=400,
                               title="Bad input")
        return RedirectResponse(local_path(f"/tasks/{tid}"), status_code=303)

    def workers(self, request: Request) -> Response:
        return self.page(request, "workers.html", "Workers", lambda: pages.workers(self.client))

    def limits(self, request: Request) -> Response:
        return self.page(request, "limits.html", "Rate limits", lambda: pages.limits(self.client))

    # ------------------------------------------------------------------ actions

    async def action(self, request: Request) -> Response:
        name = request.path_params["name"]
        form = {k: v for k, v in (await request.form()).items() if isinstance(v, str)}
        page = form.get("page", "")
        if name not in ACTIONS:
            return self.render(request, "message.html", {"heading": "No such action",
                                                         "message": f"no action {name[:40]!r}"}, status=404)
        if self.guard.read_only:
            return self.render(request, "message.html", {
                "heading": "Read-only console",
                "message": "this console was started with --read-only: it changes nothing"}, status=403)
        if not self.guard.origin_ok(dict(request.headers)) or \
                not self.guard.csrf_ok(form.get("csrf"), request.cookies.get(CSRF_COOKIE)):
            return self.render(request, "message.html", {
                "heading": "Form refused",
                "message": "this form did not come from this console's own page, or the console restarted since "
                           "the page was loaded (CSRF check): reload the page and send it again"}, status=403)
        actor = request.state.actor
        try:
            message, target = await run_in_threadpool(self.perform, name, form, actor)
        except REDIS_DOWN as exc:
            return await run_in_threadpool(self.down, request, exc)
        except (InvalidArgument, TaskNotFound, NamespaceLost, McqError) as exc:
            status = 400 if isinstance(exc, InvalidArgument) else 404 if isinstance(exc, TaskNotFound) else 409
            kind = {400: "Bad input", 404: "Not found"}.get(status, "Refused")
            error = f"{name.capitalize()}: {kind.lower()}: {exc.message}"
            return await run_in_threadpool(self.back, request, page, form, error, status)
        response = RedirectResponse(local_path(target), status_code=303)
        response.set_cookie(FLASH_COOKIE, self.guard.flash_value("ok", message), **cookie_kwargs())
        return response

    def back(self, request: Request, page: str, form: dict[str, str], error: str, status: int) -> Response:
        """The page the form was on, again, with the refusal and what was typed."""
        keep = {k: v for k, v in form.items() if k != "csrf"}
        if page == "task" and form.get("task_id"):
            return self.task(request, error=error, status=status, form=keep, task_id=form["task_id"])
        if page == "attention":
            return self.attention(request, error=error, status=status, form=keep)
        return self.dlq(request, error=error, status=status, form=keep)

    def perform(self, name: str, form: dict[str, str], actor: str) -> tuple[str, str]:
        """Run one action through the Client; returns (message, page to go to)."""
        c = self.client
        task_id = form.get("task_id", "").strip()
        reason = form.get("reason", "")
        hypothesis = form.get("hypothesis", "").strip() or None
        fingerprint = form.get("fingerprint", "").strip()
        if name == "retry":
            a = c.operator.retry_task(_need(task_id, "task id"), reason, hypothesis, actor=actor)
            return f"{a.id} created ({a.state.value}): the sweeper dispatches it", f"/tasks/{task_id}"
        if name == "cancel":
            outcome = c.operator.cancel_task(_need(task_id, "task id"), reason, actor=actor)
            note = " (the executor is told at its next heartbeat; the sweeper finishes the protocol)" \
                if outcome == "signaled" else ""
            return f"{task_id}: {outcome}{note}", f"/tasks/{task_id}"
        if name == "replay":
            if fingerprint and not task_id:
                return self.bulk(form, lambda t: c.operator.dlq_replay(t, reason, hypothesis, actor=actor),
                                 "replayed"), "/dlq"
            a = c.operator.dlq_replay(_need(task_id, "task id"), reason, hypothesis, actor=actor)
            return f"{a.id} created ({a.state.value}): replayed from the dead-letter queue", f"/tasks/{task_id}"
        # purge
        if form.get("confirm") != "yes":
            raise InvalidArgument("purging deletes the task and its whole history for good: tick the confirmation")
        keep_days = _keep_days(form.get("keep_days", "30"))
        if fingerprint and not task_id:
            return self.bulk(form, lambda t: c.operator.dlq_purge(t, reason=reason, actor=actor,
                                                                  keep_key_s=keep_days * 86_400),
                             "purged"), "/dlq"
        n = c.operator.dlq_purge(_need(task_id, "task id"), reason=reason, actor=actor, keep_key_s=keep_days * 86_400)
        return (f"{task_id} purged ({n} attempt(s)); its id and producer key are refused for {keep_days:g} day(s)",
                "/dlq")

    def group(self, fingerprint: str) -> list[str]:
        ids = self.client.reads.dlq_fingerprints().get("" if fingerprint == "(none)" else fingerprint, [])
        if not ids:
            raise InvalidArgument(f"no quarantined task's last failure has fingerprint {fingerprint[:40]!r}")
        return ids

    def bulk(self, form: Mapping[str, str], act: Callable[[str], Any], verb: str) -> str:
        """A group's "replay all" or "purge all": on the tasks its form names (the ones the page showed
        the operator) that are still in the group, never on one quarantined since; said which."""
        fingerprint = form.get("fingerprint", "").strip()
        seen = _named_tasks(form.get("ids", ""))
        current = self.group(fingerprint)
        named = set(seen)
        targets = [t for t in current if t in named]
        what = f"with fingerprint {fingerprint}"
        if not targets:
            raise InvalidArgument(f"none of the {len(seen)} task(s) shown {what} is in that group any more: "
                                  "nothing was done; reload the page to see the group as it is now")
        done, refused = 0, []
        for tid in targets:  # the first refusal stops nothing; all refused: raise the first
            try:
                act(tid)
                done += 1
            except McqError as exc:
                refused.append((tid, exc))
        if not done:
            raise refused[0][1]
        text = f"{verb} {done} of the {len(seen)} task(s) shown {what}"
        if len(seen) > len(targets):
            text += f"; {len(seen) - len(targets)} had left the group"
        unseen = len(current) - len(targets)
        if unseen and _int(form.get("count")) > len(seen):
            text += (f"; {unseen} task(s) of the group the form did not name (beyond its oldest {len(seen)}, or "
                     "quarantined since the page was shown) were left alone")
        elif unseen:
            one = unseen == 1
            text += (f"; {unseen} task{'' if one else 's'} quarantined since the page was shown "
                     f"{'was' if one else 'were'} left alone (reload the page to see {'it' if one else 'them'})")
        if refused:
            text += "; refused: " + "; ".join(f"{t}: {e.message}" for t, e in refused[:5])
        return text

    # ------------------------------------------------------------------ the sampler

    async def sampler(self) -> None:
        while True:
            try:
                await run_in_threadpool(sample, self.client, interval_s=self.sample_interval_s)
                self.last_sample_error = None
            except (*REDIS_DOWN, redis.ResponseError) as exc:
                if self.last_sample_error is None:
                    log.warning("console: cannot sample the queues: %s", exc)
                self.last_sample_error = str(exc)
            await asyncio.sleep(self.sample_interval_s)


def _without_partial(request: Request) -> str:
    rest = [(k, v) for k, v in request.query_params.multi_items() if k not in ("partial", "token")]
    return request.url.path + (f"?{urlencode(rest)}" if rest else "")


def _bytes(n: int | None) -> str:
    if n is None:
        return "?"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if abs(size) < 1024 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GB"


def _named_tasks(text: str) -> list[str]:
    """The task ids a group's form names (what the page showed): each a task id, at most BULK_MAX."""
    ids = list(dict.fromkeys(text.split()))
    if not ids:
        raise InvalidArgument("this form names no task (a page from before the console's last update, or a "
                              "hand-made form): reload the page and send it again")
    if len(ids) > pages.BULK_MAX:
        raise InvalidArgument(f"a group's form names at most {pages.BULK_MAX} tasks")
    for tid in ids:
        try:
            parse_task_id(tid)
        except ValueError as exc:
            raise InvalidArgument(f"the form names {tid[:80]!r}: {exc}") from None
    return ids


def _int(text: str | None) -> int:
    try:
        return int(text or 0)
    except ValueError:
        return 0


def _need(value: str, what: str) -> str:
    if not value:
        raise InvalidArgument(f"no {what} given")
    return value


def _keep_days(text: str) -> float:
    try:
        days = float(text or "30")
    except ValueError:
        raise InvalidArgument(f"keep the key for {text[:20]!r} days: not a number") from None
    if not 0 <= days <= 3650:
        raise InvalidArgument("the task id and producer key are kept refused for 0 to 3650 days")
    return days


class GuardMiddleware(BaseHTTPMiddleware):
    """Every request needs the token, but a local one when loopback is trusted (:mod:`.security`)."""

    def __init__(self, app: Any, console: Console) -> None:
        super().__init__(app)
        self.console = console

    async def dispatch(self, request: Request, call_next: RequestResponseEndpoint) -> Response:
        guard = self.console.guard
        headers = {k.lower(): v for k, v in request.headers.items()}
        peer = request.client.host if request.client else None
        trusted = guard.trusted(peer, headers)
        request.state.local = trusted
        request.state.actor = f"console:{peer or 'unknown'}"
        presented = guard.presented_token(headers, dict(request.cookies), dict(request.query_params))
        if not trusted and not guard.token_ok(presented):
            body = self.console.env.get_template("denied.html").render(
                {"presented": bool(presented), "trust_loopback": guard.trust_loopback})
            return HTMLResponse(body, status_code=401, headers=_security_headers())
        if request.method == "GET" and "token" in request.query_params and guard.token_ok(presented):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            target = local_path(request.url.path) + (f"?{urlencode(rest)}" if rest else "")
            response: Response = RedirectResponse(target, status_code=303)
            response.set_cookie(TOKEN_COOKIE, guard.token, **cookie_kwargs())
        else:
            response = await call_next(request)
        for k, v in _security_headers().items():
            response.headers.setdefault(k, v)
        return response


def _security_headers() -> dict[str, str]:
    return {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
            "X-Frame-Options": "DENY"}


def create_app(client: Client, *, read_only: bool = False, token: str | None = None, trust_loopback: bool = False,
               sample_interval_s: float = INTERVAL_S, sampling: bool = True, poll_ms: int = POLL_MS) -> Starlette:
    """The console's ASGI app over ``client``'s namespace. ``token``: required for every request
    (default: a new random one, ``app.state.console.guard.token``), but a local one when
    ``trust_loopback`` (:mod:`.security`). ``sampling``: sample the queues every ``sample_interval_s``
    while the app runs (its lifespan)."""
    rules: dict[str, Any] = {"read_only": read_only, "trust_loopback": trust_loopback}
    guard = Guard(token=token, **rules) if token else Guard(**rules)
    console = Console(client, guard, sample_interval_s=sample_interval_s, sampling=sampling, poll_ms=poll_ms)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        task = asyncio.create_task(console.sampler()) if console.sampling else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def healthz(request: Request) -> Response:
        return PlainTextResponse("ok")

    routes = [
        Route("/", console.overview),
        Route("/tasks", console.tasks),
        Route("/tasks/{task_id}", console.task),
        Route("/attention", console.attention),
        Route("/dlq", console.dlq),
        Route("/workers", console.workers),
        Route("/limits", console.limits),
        Route("/go", console.go),
        Route("/healthz", healthz),
        Route("/actions/{name}", console.action, methods=["POST"]),
        Mount("/static", StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
    app = Starlette(routes=routes, middleware=[Middleware(GuardMiddleware, console=console)], lifespan=lifespan)
    app.state.console = console
    return app
