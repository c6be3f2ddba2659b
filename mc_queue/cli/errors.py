"""How ``mcq`` fails: one line on stderr, no traceback, and an exit code a script can act on.

Exit codes: 0 done; 1 refused by a contract (the refusal is recorded); 2 bad input, nothing
written (one line, no traceback); 3 the namespace lost state and needs ``mcq recover``; 4 Redis
cannot be reached, or (a read on the embedded default) no embedded server is running: reads never
start one; 6 new work refused for now, nothing written: Redis memory above the enqueue high-water mark
(``Overloaded``), or the queue at its cap (``QueueFull``, printed with its retry-after).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click
import redis

from ..client.connect import NoEmbeddedServer
from ..contracts.errors import (
    ConfigurationError,
    InvalidArgument,
    McqError,
    NamespaceLost,
    Overloaded,
    QueueFull,
    TaskNotFound,
)

F = TypeVar("F", bound=Callable[..., Any])


class OneLineUsageError(click.UsageError):
    """A usage error as one line (``mcq cancel: Invalid value for '--ack-timeout': ...``), exit 2."""

    def show(self, file: Any = None) -> None:
        path = self.ctx.command_path if self.ctx is not None else "mcq"
        click.echo(f"{path}: {self.format_message()} (see `{path} --help`)", err=True)


def one_line(exc: click.UsageError) -> click.UsageError:
    if isinstance(exc, (OneLineUsageError, click.exceptions.NoArgsIsHelpError)):
        return exc
    return OneLineUsageError(exc.format_message(), exc.ctx)


def fail(message: str, code: int) -> None:
    click.echo(f"mcq: {message}", err=True)
    sys.exit(code)


EXIT_REFUSED, EXIT_BAD_INPUT, EXIT_LOST, EXIT_UNREACHABLE = 1, 2, 3, 4
EXIT_OVERLOADED = 6  # Redis memory above the enqueue high-water mark, or the queue at its cap: retry later
#                     (5 is `mcq worker`'s)


def queue_full(exc: QueueFull) -> str:
    """QueueFull's message with when to retry: its retry-after, or (0) that a retry as is cannot help."""
    text = str(exc)
    if exc.retry_after_s > 0:
        return text if "retry in about" in text else f"{text}; retry in about {math.ceil(exc.retry_after_s)} s"
    return f"{text}; retrying it as is cannot help: give it a later start_by, or none"


def handle_errors(fn: F) -> F:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (InvalidArgument, TaskNotFound, ConfigurationError) as exc:
            fail(str(exc), EXIT_BAD_INPUT)
        except NoEmbeddedServer as exc:
            fail(str(exc), EXIT_UNREACHABLE)
        except NamespaceLost as exc:
            fail(str(exc), EXIT_LOST)
        except QueueFull as exc:  # (an Overloaded: the same exit code, with its retry-after)
            fail(queue_full(exc), EXIT_OVERLOADED)
        except Overloaded as exc:
            fail(str(exc), EXIT_OVERLOADED)
        except McqError as exc:  # a contract refused (IdempotencyConflict, TaskPurged, a stale fence ...)
            fail(str(exc), EXIT_REFUSED)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            fail(f"cannot reach Redis: {type(exc).__name__}: {exc}", EXIT_UNREACHABLE)
        except redis.ResponseError as exc:
            if "DB index is out of range" not in str(exc):
                raise
            fail("bad Redis URL: the server has no database of the number its path names (redis://host:port/N; "
                 "a server has 16 unless configured otherwise, 0-15)", EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]
