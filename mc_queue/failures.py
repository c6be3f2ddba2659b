"""Failure records and their stable fingerprints (class, type, normalised message; never a time)."""

from __future__ import annotations

import hashlib
import re

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


def make_failure(failure_class: FailureClass | str, type_name: str, message: str = "",
                 retryable: bool | None = None) -> Failure:
    fc = FailureClass(failure_class)
    return Failure(failure_class=fc, type=type_name, message=message[:2000],
                   fingerprint=fingerprint(fc, type_name, message), retryable=retryable)


