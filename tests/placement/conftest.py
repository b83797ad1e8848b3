"""Fixtures: real Placement servers (``python -m berth.placement serve``) on free ports.

``server`` is a session-wide SQLite server in legacy policy mode; ``pg_server`` one on a
fresh PostgreSQL database that is dropped afterwards (skipped when PostgreSQL is not
reachable). ``api`` wraps httpx with the admin token and a chosen microversion.
``engine`` is a migrated store engine on SQLite and on PostgreSQL (a database per
module), for the tests of the store itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from berth.placement import db
from pgdb import fresh_pg_database
from placement.support import Api, Server, start_server


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


@pytest.fixture(scope="session")
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this session, dropped afterwards."""
    with fresh_pg_database("berth_test") as url:
        yield url


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


@pytest.fixture(scope="module")
def pg_database() -> Iterator[str]:
    """A fresh PostgreSQL database for one test module (skipped when PostgreSQL is down)."""
    with fresh_pg_database("berth_store") as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A migrated engine of the store, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'store.sqlite'}"
    else:
        url = request.getfixturevalue("pg_database")
    eng = db.prepare(url)
    yield eng
    eng.dispose()
