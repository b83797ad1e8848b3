"""Database faults: which errors mean "the database is unavailable", and when a retry is
safe.

Two kinds of error are the database being unavailable rather than the request being
wrong (:func:`unavailable`):

* **a lost connection**: the server restarted, a backend was terminated
  (``pg_terminate_backend``), the network dropped (SQLAlchemy's
  ``connection_invalidated``, SQLSTATE class 08, 57P01-57P03), or no connection could be
  had from the pool in time;
* **a lock wait past its timeout**: SQLite's "database is locked" after its busy
  timeout, PostgreSQL's ``lock_not_available`` (55P03).

:func:`call_with_retry` runs an operation and, on such an error, runs it again when that
is safe: always for a read (``safe=True``); for a write only when the failed statement
was not the ``COMMIT``, so the transaction certainly rolled back (a connection lost
during the commit leaves its outcome unknown, and the write is not repeated). A lost
connection is retried at once with a fresh one (``attempts`` in all, short pauses); a
lock that already held the caller for the whole busy timeout is not waited for again.
Whatever is not retried, or still fails, becomes
:class:`~berth.errors.ServiceUnavailable`: HTTP 503 with ``Retry-After``, never a 500.

Deadlocks and serialization failures (40P01, 40001) are a lost race, not an outage:
Placement answers them 409 "concurrent update" and the client retries with fresh
generations, as before.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

from sqlalchemy import exc as sa_exc

from berth.errors import ServiceUnavailable

LOG = logging.getLogger(__name__)

T = TypeVar("T")
P = ParamSpec("P")

#: Attempts of a retried operation, and the pause before each retry (seconds).
ATTEMPTS = 3
PAUSES = (0.05, 0.3)

#: What a lost connection's message says where it carries no SQLSTATE (psycopg's
#: errors while connecting have none: a server starting, stopping or out of slots).
_LOST_TEXTS = ("server closed the connection", "terminating connection",
               "connection is closed", "connection already closed", "the connection is lost",
               "could not connect", "connection refused", "consuming input failed",
               "ssl syscall", "connection timed out", "unable to open database file",
               "too many clients", "remaining connection slots are reserved",
               "the database system is starting up", "the database system is shutting down",
               "the database system is not yet accepting connections",
               "the database system is in recovery mode")


def _sqlstate(exc: BaseException) -> str:
    orig = getattr(exc, "orig", None)
    return str(getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None) or "")


def lost_connection(exc: BaseException) -> bool:
    """Whether ``exc`` says the database connection is gone (or none could be had)."""
    if isinstance(exc, sa_exc.TimeoutError):  # the pool had no connection in time
        return True
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if exc.connection_invalidated:
        return True
    state = _sqlstate(exc)
    if state.startswith("08") or state in ("57P01", "57P02", "57P03", "53300"):
        return True
    text = str(exc.orig).lower()
    return isinstance(exc, sa_exc.OperationalError) and any(t in text for t in _LOST_TEXTS)


def lock_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is a lock wait that ran out of time."""
    if not isinstance(exc, sa_exc.OperationalError):
        return False
    return _sqlstate(exc) == "55P03" or "database is locked" in str(exc.orig)


def unavailable(exc: BaseException) -> bool:
    """A lost connection or a lock timeout: the database, not the request, failed."""
    return lost_connection(exc) or lock_timeout(exc)


def rolled_back(exc: BaseException) -> bool:
    """Whether the failed transaction certainly did not commit: the error came from a
    statement other than the ``COMMIT`` (SQLAlchemy reports a failed commit with no
    statement)."""
    statement = getattr(exc, "statement", None)
    return bool(statement) and not str(statement).lstrip().upper().startswith("COMMIT")


def describe(exc: BaseException) -> str:
    """One line about the fault, for logs and the 503's message."""
    if lock_timeout(exc):
        return "the database is locked (a lock wait timed out)"
    return "the database connection was lost"


def as_unavailable(exc: BaseException) -> ServiceUnavailable:
    """The :class:`ServiceUnavailable` reporting ``exc``."""
    return ServiceUnavailable(f"{describe(exc)}; try again shortly")


def call_with_retry(operation: Callable[[], T], *, safe: bool, what: str = "operation",
                    attempts: int = ATTEMPTS) -> T:
    """Run ``operation``; on an :func:`unavailable` database retry it where safe (see
    the module docstring), else raise :class:`ServiceUnavailable`. Other errors pass
    through untouched."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return operation()
        except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
            if not unavailable(exc):
                raise
            again = (attempt < attempts and lost_connection(exc)
                     and (safe or rolled_back(exc)))
            if not again:
                LOG.warning("%s failed: %s (%s)", what, describe(exc), str(exc).splitlines()[0])
                raise as_unavailable(exc) from exc
            LOG.info("%s: %s; retrying (attempt %d of %d)", what, describe(exc),
                     attempt + 1, attempts)
            time.sleep(PAUSES[min(attempt - 1, len(PAUSES) - 1)])


def retried(*, safe: bool) -> Callable[[Callable[P, T]], Callable[P, T]]:
    """Decorate a function that runs one database transaction with
    :func:`call_with_retry` (``safe``: a read, or a write that may run twice)."""

    def wrap(fn: Callable[P, T]) -> Callable[P, T]:
        @functools.wraps(fn)
        def run(*args: P.args, **kwargs: P.kwargs) -> T:
            return call_with_retry(lambda: fn(*args, **kwargs), safe=safe, what=fn.__qualname__)

        return run

    return wrap
