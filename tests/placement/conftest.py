"""Fixtures: real Placement servers (``python -m berth.placement serve``) on free ports.

``server`` is a session-wide SQLite server in legacy policy mode; ``pg_server`` one on a
fresh PostgreSQL database that is dropped afterwards (skipped when PostgreSQL is not
reachable). ``api`` wraps httpx with the admin token and a chosen microversion.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from placement.support import Api, Server, start_server

PG_ADMIN_URL = os.environ.get(
    "BERTH_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A SQLite-backed server in legacy policy mode, shared by the session."""
    db = str(Path(tmp_path_factory.mktemp("placement")) / "placement.sqlite")
    srv = start_server(db)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def api(server: Server) -> Iterator[Api]:
    """Admin API against the SQLite server."""
    client = Api(server.url)
    yield client
    client.http.close()


def _pg_admin_engine() -> Any:
    import sqlalchemy as sa

    return sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this session, dropped afterwards."""
    import sqlalchemy as sa

    try:
        engine = _pg_admin_engine()
        with engine.connect() as conn:
            conn.execute(sa.text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any connection failure means "skip"
        pytest.skip(f"PostgreSQL not reachable at {PG_ADMIN_URL}: {exc}")
    name = f"berth_test_{uuid.uuid4().hex[:12]}"
    with engine.connect() as conn:
        conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    yield url
    with engine.connect() as conn:
        conn.execute(
            sa.text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
            {"n": name},
        )
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}"'))
    engine.dispose()


@pytest.fixture(scope="session")
def pg_server(pg_url: str) -> Iterator[Server]:
    """A PostgreSQL-backed server."""
    srv = start_server(pg_url)
    yield srv
    srv.stop()


@pytest.fixture(scope="session")
def pg_api(pg_server: Server) -> Iterator[Api]:
    """Admin API against the PostgreSQL server."""
    client = Api(pg_server.url)
    yield client
    client.http.close()


@pytest.fixture(params=["sqlite", "postgresql"])
def any_api(request: pytest.FixtureRequest) -> Api:
    """The API on SQLite and on PostgreSQL (write-path tests run on both)."""
    if request.param == "sqlite":
        return request.getfixturevalue("api")  # type: ignore[no-any-return]
    return request.getfixturevalue("pg_api")  # type: ignore[no-any-return]
