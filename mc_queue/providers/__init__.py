"""Providers shipped with mc_queue: a git remote and an HTTP pull-request API.

The protocol (see :mod:`mc_queue.policy.effects`): ``perform(key) -> receipt`` does the operation passing
the key to the provider; ``reconcile(key) -> receipt | None`` asks the provider whether it did,
raising when it cannot tell. A GitHub pull-request provider is the same shape as
:class:`~mc_queue.providers.http.HttpPullRequests` (it would look the key up in PR bodies or a
label).
"""

from .git import GitError, GitRemote, GitTimeout
from .http import HttpPullRequests

__all__ = ["GitError", "GitRemote", "GitTimeout", "HttpPullRequests"]
