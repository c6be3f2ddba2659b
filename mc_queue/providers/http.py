"""An HTTP pull-request API through httpx, with an ``Idempotency-Key`` header and a key lookup.

Wire protocol (what :class:`mc_queue.testing.ForgeServer` implements, and what a real forge
adapter maps to):

- ``POST {base}/repos/{repo}/pulls`` with JSON ``{"head", "base", "title", "body"}`` and header
  ``Idempotency-Key: <key>`` -> 201 (or 200 for a replay) ``{"number", "url", "idempotency_key"}``;
- ``GET {base}/pulls?idempotency_key=<key>`` -> 200 ``{"number", ...}`` or 404 when there is none;
- every creation also carries ``Mcq-Fence: <fence>``, the fencing generation of the Attempt that
  makes the call. A provider that keeps the highest fence seen per Idempotency-Key and refuses a
  lower one (409) stops a zombie worker that resumes between its intent and its call, after
  reconciliation found nothing and a replacement made the call: Kleppmann's fencing token checked
  at the storage (``ForgeServer(enforce_fence=True)`` implements it);
- with a writer lease (a concurrency key of one slot, ``App.concurrency``), a creation also carries
  ``Mcq-Writer: <key>=<writer fence>`` (``ctx.attempt.slots[key]``): the key's fence grows with each
  Attempt given its slot, across tasks, so a provider that keeps the highest seen per key and refuses a
  lower one (409) stops a writer whose lease a newer one replaced (``ForgeServer(enforce_fence=True)``);
- a forge that allows one open pull request per head branch (GitHub does) answers 422 to a second
  one: the same fence by another rule. Without either (and without honoring Idempotency-Key) no
  queue can stop that zombie's call from landing; reconciliation then sees both.

The key is also written into the PR body, so a provider that ignores the header still lets the
lookup find it.
"""

from __future__ import annotations

from typing import Any

import httpx


class HttpPullRequests:
    def __init__(self, base_url: str, *, timeout: float = 5.0, token: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._http = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout, headers=headers,
                                  transport=transport)

    def close(self) -> None:
        self._http.close()

    def open_pr(self, key: str, *, repo: str, head: str, base: str, title: str, body: str = "",
                fence: int | None = None, timeout: float | None = None,
                writer: tuple[str, int] | None = None) -> dict[str, Any]:
        """Create the pull request; returns the provider's receipt. ``fence``: the calling Attempt's
        fence (``ctx.fence``), sent as ``Mcq-Fence`` for the provider to check. ``timeout``: this call's
        (``ctx.time_for(...)``: what is left of the Attempt's timeout budget), else the client's. Raises httpx errors as
        they come (401/403 authorization, 409 a stale fence, 429/503 capacity, timeouts provider: see
        mc_queue.policy.classify.classify). ``writer``: (concurrency key, writer fence) of the writer lease
        this Attempt holds, sent as ``Mcq-Writer``."""
        headers = {"Idempotency-Key": key}
        if fence is not None:
            headers["Mcq-Fence"] = str(int(fence))
        if writer is not None:
            headers["Mcq-Writer"] = f"{writer[0]}={int(writer[1])}"
        resp = self._http.post(f"/repos/{repo}/pulls", headers=headers,
                               json={"head": head, "base": base, "title": title,
                                     "body": f"{body}\n\nMcq-Operation-Key: {key}"},
                               timeout=httpx.USE_CLIENT_DEFAULT if timeout is None else timeout)
        if resp.status_code == 422:
            # The forge already has a pull request for this head (GitHub's own uniqueness): if it is
            # ours (same operation key), that is the receipt; if not, the 422 stands.
            found = self.find_pr(key)
            if found is not None:
                return found
        resp.raise_for_status()
        data = resp.json()
        return {"number": data["number"], "url": data.get("url"), "key": key}

    def find_pr(self, key: str) -> dict[str, Any] | None:
        """The receipt of the pull request created with ``key``, or None when the provider has none.
        Raises when the provider cannot answer (the reconciler records 'unknown')."""
        resp = self._http.get("/pulls", params={"idempotency_key": key})
        if resp.status_code == 404:
            return None
        resp.raise_for_status()
        data = resp.json()
        return {"number": data["number"], "url": data.get("url"), "key": key}
