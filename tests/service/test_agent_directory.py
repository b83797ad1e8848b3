"""Which agent process runs each host: the directory every conductor asks before a build."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import event

from berth.placement.db import prepare
from berth.service.compute_rpc import AgentDirectory


def test_a_conductor_reads_the_directory_once_then_only_what_it_misses(tmp_path: Path) -> None:
    engine = prepare(f"sqlite:///{tmp_path / 'berth.sqlite'}")
    fleet, conductor = AgentDirectory(engine), AgentDirectory(engine)
    fleet.register(["h1", "h2"], "compute.a")
    queries: list[str] = []
    event.listen(engine, "before_cursor_execute",
                 lambda _c, _cur, sql, *_: queries.append(sql))
    assert conductor.server_of("h1") == "compute.a"
    assert conductor.server_of("h2") == "compute.a"
    assert len(queries) == 1  # the whole directory, once
    # A host registered since: one read of its row.
    fleet.register(["h3"], "compute.b")
    queries.clear()
    assert conductor.server_of("h3") == "compute.b"
    assert conductor.server_of("nowhere") is None
    assert len(queries) == 2
    # A host that moved: the conductor forgets it and reads its row again.
    fleet.register(["h1"], "compute.b")
    assert conductor.server_of("h1") == "compute.a"
    conductor.forget("h1")
    assert conductor.server_of("h1") == "compute.b"
