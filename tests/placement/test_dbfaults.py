"""Which database errors are an unavailable database (retried where safe, else 503),
and the bounded lock waits of PostgreSQL sessions."""

from __future__ import annotations

import psycopg
import pytest
import sqlalchemy as sa

from berth.placement import dbfaults
from berth.placement.db import create_db_engine
from berth.placement.store_raw import RawConnection


def _wrapped(message: str) -> sa.exc.DBAPIError:
    """A driver error as SQLAlchemy wraps it, without a SQLSTATE (as psycopg's errors
    while connecting come)."""
    return sa.exc.DBAPIError.instance("SELECT 1", None, psycopg.OperationalError(message),
                                      psycopg.Error)


@pytest.mark.parametrize("message", [
    "connection failed: FATAL:  sorry, too many clients already",
    "FATAL:  remaining connection slots are reserved for roles with the SUPERUSER attribute",
    "FATAL:  the database system is starting up",
    "FATAL:  the database system is shutting down",
    "FATAL:  the database system is not yet accepting connections",
    "FATAL:  the database system is in recovery mode",
])
def test_a_server_that_cannot_take_a_connection_is_unavailable(message: str) -> None:
    assert dbfaults.unavailable(_wrapped(message))


def test_a_request_error_is_not_unavailable() -> None:
    assert not dbfaults.unavailable(_wrapped('FATAL:  database "nope" does not exist'))


def test_a_connection_that_cannot_be_made_is_a_lost_connection_that_may_be_retried() -> None:
    """The pool passes psycopg's own error up from a connect; a raw connection wraps it
    as SQLAlchemy's, marked lost, and nothing ran, so even a write may run again."""
    from berth.service.localcluster import free_port

    engine = create_db_engine(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/none")
    try:
        with pytest.raises(sa.exc.DBAPIError) as caught:
            RawConnection(engine)
    finally:
        engine.dispose()
    assert dbfaults.lost_connection(caught.value) and dbfaults.rolled_back(caught.value)


def test_postgres_sessions_wait_for_a_lock_at_most_the_busy_timeout() -> None:
    from berth.placement.db import SQLITE_BUSY_TIMEOUT
    from pgdb import PG_ADMIN_URL

    for url, expected in ((PG_ADMIN_URL, f"{SQLITE_BUSY_TIMEOUT}s"),
                          (PG_ADMIN_URL + "?options=-c%20lock_timeout%3D5s", "5s")):
        engine = create_db_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("SHOW lock_timeout")).scalar() == expected
        except sa.exc.OperationalError as exc:
            pytest.skip(f"PostgreSQL not reachable: {exc}")
        finally:
            engine.dispose()
