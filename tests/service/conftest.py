"""Fixtures: a fresh SQLite resource store per test, wired into a stack.

The database is migrated once per session into a template file; each test copies it
(migrating takes ~1 s, a copy a few ms).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from berth.config import SchedulerConfig
from berth.service.stack import Stack, open_stack

#: Filters and weighers the service tests rely on (kept small and explicit).
TEST_CONFIG = SchedulerConfig.from_dict({
    "filter_scheduler": {
        "available_filters": ["berth.filters.compute.ComputeFilter"],
        "enabled_filters": ["ComputeFilter"],
        "weight_classes": ["RAMWeigher"],
    },
})


@pytest.fixture(scope="session")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty database file."""
    from berth.placement.db import prepare
    from berth.service.records import ComputeRecordStore

    path = Path(tmp_path_factory.mktemp("template")) / "berth.sqlite"
    engine = prepare(f"sqlite:///{path}")
    ComputeRecordStore(engine)
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    return path


def fresh_stack(
    template: Path, directory: Path, config: SchedulerConfig = TEST_CONFIG,
    *, through_api: bool = False,
) -> Stack:
    """A stack over a private copy of the template database."""
    from berth.placement.db import create_db_engine

    path = directory / "berth.sqlite"
    shutil.copy(template, path)
    return open_stack(f"sqlite:///{path}", config, engine=create_db_engine(f"sqlite:///{path}"),
                      through_api=through_api)


@pytest.fixture(params=["in-process", "through-api"])
def stack(request: pytest.FixtureRequest, template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    """A stack on a fresh SQLite database; schedulers call the store directly, or go
    through the Placement API (every test runs both ways)."""
    st = fresh_stack(template_db, tmp_path, through_api=request.param == "through-api")
    yield st
    st.close()


@pytest.fixture
def first(template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    """The stack of the run before a restart (the restart tests reopen its database)."""
    st = fresh_stack(template_db, tmp_path)
    yield st
    st.close()


@pytest.fixture
def one_attempt(template_db: Path, tmp_path: Path) -> Iterator[Stack]:
    """Hosts h0-h2 with 8192 + 256 x i MB and ``max_attempts = 1`` (no alternates).

    RAMWeigher spreads: the first instance of a request goes to h2, and after its 512 MB
    the second to h1 (8448 MB free against h2's 8192).
    """
    from .builders import node  # builders reads this module's TEST_CONFIG

    st = fresh_stack(template_db, tmp_path, TEST_CONFIG.replace("scheduler", max_attempts=1))
    st.register_hosts([node(f"h{i}", memory_mb=8192 + i * 256) for i in range(3)])
    yield st
    st.close()
