"""Store internals: migrations, standard names, the cached provider graph."""

from __future__ import annotations

from pathlib import Path

import os_resource_classes
import os_traits
import sqlalchemy as sa
from alembic.config import Config
from alembic.script import ScriptDirectory

from berth.placement import db
from berth.placement.store import InventoryRecord, PlacementStore


def test_head_revision_constant_matches_the_shipped_scripts() -> None:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(db.__file__).parent / "migrations"))
    assert ScriptDirectory.from_config(cfg).get_current_head() == db.HEAD_REVISION


def test_prepare_migrates_syncs_standards_and_is_idempotent(tmp_path: Path) -> None:
    url = str(tmp_path / "p.sqlite")
    engine = db.prepare(url)
    assert db.current_revision(engine) == db.HEAD_REVISION
    db.prepare(url)
    with engine.connect() as conn:
        rcs = conn.execute(
            sa.select(db.resource_classes.c.id, db.resource_classes.c.name).order_by(
                db.resource_classes.c.id
            )
        ).all()
        assert [r.name for r in rcs] == list(os_resource_classes.STANDARDS)
        assert [r.id for r in rcs] == list(range(21))
        n_traits = conn.execute(sa.select(sa.func.count()).select_from(db.traits)).scalar()
        assert n_traits == len(os_traits.get_traits())


def test_provider_graph_is_cached_until_data_changes(tmp_path: Path) -> None:
    store = PlacementStore(db.prepare(str(tmp_path / "g.sqlite")))
    rp = store.create_provider("cn1", None, None)
    store.set_inventories(
        rp.uuid,
        0,
        {"VCPU": InventoryRecord("VCPU", 8, 0, 1, 8, 1, 16.0)},
        (1, 39),
    )
    first = store.provider_graph()
    assert store.provider_graph() is first
    (provider,) = first.providers
    assert provider.uuid == rp.uuid and provider.inventories["VCPU"].allocation_ratio == 16.0
    assert "VCPU" in first.known_classes and "HW_CPU_X86_AVX" in first.known_traits
    store.create_provider("cn2", None, None)
    second = store.provider_graph()
    assert second is not first and len(second.providers) == 2
