"""Failure records and their stable fingerprints (class, type, normalised message; never a time)."""

from __future__ import annotations

import hashlib
import re
import traceback as _tb

from .models import Failure, FailureClass

_NORMALISERS = [
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"\b[0-9a-f]{7,64}\b", re.I), "<hex>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[T ][\d:.]+Z?"), "<time>"),
    (re.compile(r"0x[0-9a-f]+", re.I), "<addr>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
    (re.compile(r"\s+"), " "),
]


def normalise_message(message: str) -> str:
    out = message.strip()
    for pattern, repl in _NORMALISERS:
        out = pattern.sub(repl, out)
    return out[:500]


def fingerprint(failure_class: FailureClass | str, type_name: str, message: str) -> str:
    basis = f"{FailureClass(failure_class).value}|{type_name}|{normalise_message(message)}"
    return hashlib.sha256(basis.encode()).hexdigest()[:16]


# The traceback a failure record keeps: its newest frames only, newest last, and at most this many
# bytes of UTF-8 (the oldest lines are cut first). lua/fail.lua and lua/reconcile_settle.lua bound
# the whole failure JSON at 128 KiB: 8 KiB escaped as ASCII JSON (at most 6 bytes a byte) plus a
# 2000-character message (at most 12 bytes a character) stay well below it.
TRACEBACK_MAX_FRAMES = 20
TRACEBACK_MAX_BYTES = 8192


def cap_traceback(text: str | None, max_bytes: int = TRACEBACK_MAX_BYTES) -> str | None:
    """``text`` cut to its last ``max_bytes`` bytes of UTF-8 at a line start, saying how much was cut."""
    if not text:
        return None
    raw = text.encode("utf-8", "replace")
    if len(raw) <= max_bytes:
        return text
    head = f"[{len(raw)} bytes of traceback, oldest lines cut]\n"
    tail = raw[len(raw) - (max_bytes - len(head.encode())):].decode("utf-8", "ignore")
    cut = tail.find("\n")
    if 0 <= cut < len(tail.rstrip("\n")):  # start at a whole line, unless the newest line alone is too long
        tail = tail[cut + 1:]
    return head + tail


def format_traceback(exc: BaseException, max_frames: int = TRACEBACK_MAX_FRAMES,
                     max_bytes: int = TRACEBACK_MAX_BYTES) -> str | None:
    """The exception's traceback as Python prints it, bounded: its last ``max_frames`` frames (of each
    chained exception), newest last, then capped at ``max_bytes``. None if it cannot be formatted."""
    try:
        text = "".join(_tb.TracebackException.from_exception(exc, limit=-max_frames).format())
    except Exception:  # a broken __str__ or a pathological chain: the record keeps its message only
        return None
    return cap_traceback(text, max_bytes)


def make_failure(failure_class: FailureClass | str, type_name: str, message: str = "",
                 retryable: bool | None = None, traceback: str | BaseException | None = None) -> Failure:
    """A failure record; ``traceback`` is an exception (its bounded traceback is kept) or a text (capped)."""
    fc = FailureClass(failure_class)
    tb = format_traceback(traceback) if isinstance(traceback, BaseException) else cap_traceback(traceback)
    return Failure(failure_class=fc, type=type_name, message=message[:2000],
                   fingerprint=fingerprint(fc, type_name, message), retryable=retryable, traceback=tb)


