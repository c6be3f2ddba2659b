"""JSON in, JSON out: nothing that crosses Redis is pickled. Canonical form for digests."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from .errors import InvalidPayload

MAX_PAYLOAD_BYTES = 512 * 1024


def canonical_json(value: Any, *, what: str = "value") -> str:
    """Sorted keys, no spaces, no NaN/Infinity; raises InvalidPayload saying what is wrong."""
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidPayload(
            f"{what} is not plain JSON ({exc}); send dicts, lists, strings, numbers, booleans and null only"
        ) from None


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def encode_payload(payload: Any, max_bytes: int = MAX_PAYLOAD_BYTES) -> tuple[str, str]:
    """Validate a task payload and return (canonical JSON, sha256)."""
    if not isinstance(payload, dict):
        raise InvalidPayload(
            f"payload must be a JSON object (a dict), got {type(payload).__name__}; wrap it, e.g. {{\"value\": ...}}"
        )
    text = canonical_json(payload, what="payload")
    size = len(text.encode())
    if size > max_bytes:
        raise InvalidPayload(
            f"payload is {size} bytes, over the {max_bytes}-byte limit; store large inputs elsewhere "
            "(a git ref, an object store) and send their reference"
        )
    return text, digest(text)
