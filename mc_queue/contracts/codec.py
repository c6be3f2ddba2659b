"""JSON in, JSON out: nothing that crosses Redis is pickled. Canonical form for digests.

Everything mc_queue stores is checked here before it is sent, with the same bounds the Lua scripts
enforce again on their side (a script refuses what a careless or hostile caller sends directly):

- JSON values: dicts with string keys, lists, strings, finite numbers, booleans and null; nested at
  most ``MAX_DEPTH`` deep; strings that are valid Unicode (no lone surrogate). The canonical text
  has sorted keys, no spaces and is printable ASCII (everything else escaped), so it digests the same
  everywhere and the scripts can check it cheaply.
- Plain text arguments (worker ids, reasons, phases): valid Unicode without control characters
  (a newline in an id or a reason would forge lines in logs and listings), bounded in bytes.
- Numbers: integers within bounds; cost as a finite, non-negative decimal.
"""

from __future__ import annotations

import hashlib
import json
import math
from decimal import Decimal
from typing import Any

from pydantic import BaseModel

from .errors import InvalidArgument, InvalidPayload

MAX_PAYLOAD_BYTES = 512 * 1024
MAX_DEPTH = 64
MAX_INT = 2**53 - 1
MAX_COST = 1e9
MAX_TOKENS = 10**12


def check_json(value: Any, *, what: str = "value", max_depth: int = MAX_DEPTH) -> None:
    """Raise InvalidPayload unless ``value`` is plain JSON mc_queue can store and read back."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if depth > max_depth:
            raise InvalidPayload(f"{what} is nested more than {max_depth} levels deep; flatten it")
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            _check_unicode(item, what)
        elif isinstance(item, int):
            continue
        elif isinstance(item, float):
            if not math.isfinite(item):
                raise InvalidPayload(f"{what} holds {item!r}, which JSON cannot carry; send a finite number or null")
        elif isinstance(item, dict):
            for k, v in item.items():
                if not isinstance(k, str):
                    raise InvalidPayload(f"{what} has a {type(k).__name__} key {k!r}; JSON object keys are strings")
                _check_unicode(k, what)
                stack.append((v, depth + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1) for v in item)
        else:
            raise InvalidPayload(
                f"{what} holds a {type(item).__name__}, which is not plain JSON; send dicts, lists, strings, "
                "numbers, booleans and null only")


def _check_unicode(s: str, what: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidPayload(f"{what} holds a string that is not valid Unicode ({exc.reason} at position "
                             f"{exc.start}); send text, or base64 for bytes") from None


def canonical_json(value: Any, *, what: str = "value") -> str:
    """Sorted keys, no spaces, ASCII only, no NaN/Infinity; raises InvalidPayload saying what is wrong."""
    check_json(value, what=what)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def model_json(model: BaseModel) -> str:
    """A pydantic record in the canonical form (what the scripts store)."""
    return canonical_json(model.model_dump(mode="json"), what=type(model).__name__)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def encode_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[str, str]:
    """Validate a task payload and return (canonical JSON, sha256)."""
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict), got {type(payload).__name__}; wrap it, e.g. {{\"value\": ...}}"
        )
    text = canonical_json(payload, what="payload")
    size = len(text)
    if size > max_bytes:
        raise InvalidPayload(
            f"payload is {size} bytes, over the {max_bytes}-byte limit; store large inputs elsewhere "
            "(a git ref, an object store) and send their reference"
        )
    return text, digest(text)


def check_text(value: Any, *, what: str, max_bytes: int = 2000, min_chars: int = 0, spaces: bool = True) -> str:
    """A plain text argument: a str of valid Unicode without control characters, at most ``max_bytes``."""
    if not isinstance(value, str):
        raise InvalidArgument(f"{what} must be a string, got {type(value).__name__}")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidArgument(f"{what} is not valid Unicode (a lone surrogate?)") from None
    if size > max_bytes:
        raise InvalidArgument(f"{what} is {size} bytes, over the limit of {max_bytes}")
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise InvalidArgument(f"{what} {value[:60]!r} contains a control character (newline, tab, NUL ...); "
                              "send one line of text")
    if not spaces and (" " in value or not value):
        raise InvalidArgument(f"{what} {value[:60]!r} must be non-empty without spaces")
    if min_chars and len(value.strip()) < min_chars:
        raise InvalidArgument(f"{what} needs at least {min_chars} characters (after trimming spaces)")
    return value


def check_int(value: Any, *, what: str, low: int = 0, high: int = MAX_INT) -> int:
    """An integer argument within [low, high]; bools, floats and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidArgument(f"{what} must be an integer, got {value!r}")
    if not low <= value <= high:
        raise InvalidArgument(f"{what} must be between {low} and {high}, got {value}")
    return value


def check_seconds(value: Any, *, what: str, high: float, low: float = 0.0) -> float:
    """A duration in seconds: a finite int or float in (low, high]; bools and strings are refused."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low < value <= high:
        raise InvalidArgument(f"{what} must be a number of seconds in ({low:g}, {high:g}], got {value!r}")
    return float(value)


def decimal_text(value: Any, *, what: str, high: float = MAX_COST) -> str:
    """A cost as the plain decimal the scripts take: finite, >= 0, at most 9 decimals, no exponent."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidArgument(f"{what} must be a number, got {value!r}")
    if not math.isfinite(value) or value < 0 or value > high:
        raise InvalidArgument(f"{what} must be a finite number between 0 and {high:g}, got {value!r}")
    text = format(Decimal(repr(float(value))).quantize(Decimal("0.000000001")).normalize(), "f")
    return text
