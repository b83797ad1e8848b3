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


def test_incremental_graph_refresh_matches_a_full_rebuild(tmp_path: Path) -> None:
    from berth.placement.store import ConsumerWrite

    engine = db.prepare(str(tmp_path / "inc.sqlite"))
    store = PlacementStore(engine)
    inv = {"VCPU": InventoryRecord("VCPU", 8, 0, 1, 8, 1, 1.0)}
    a = store.create_provider("a", None, None)
    b = store.create_provider("b", None, None)
    child = store.create_provider("child", None, a.uuid)
    for rp in (a, b):
        store.set_inventories(rp.uuid, 0, inv, (1, 39))
    store.provider_graph()
    # A mix of changes: claim, move a child, aggregates, delete, traits, allocation removal.
    store.write_allocations(
        [ConsumerWrite("c1", "p", "u", [(a.uuid, "VCPU", 3)], "INSTANCE", None)], post=False
    )
    store.update_provider(
        child.uuid, "child", set_parent=True, parent_uuid=b.uuid, allow_reparent=True
    )
    store.set_aggregates(b.uuid, ["11111111-1111-1111-1111-111111111111"], None)
    gone = store.create_provider("gone", None, None)
    store.provider_graph()
    store.delete_provider(gone.uuid)
    store.set_provider_traits(a.uuid, ["HW_CPU_X86_AVX"], store.get_provider(a.uuid).generation)  # type: ignore[union-attr]
    store.delete_consumer_allocations("c1")
    incremental = store.provider_graph()
    fresh = PlacementStore(engine).provider_graph()
    assert incremental.providers == fresh.providers
    by_name = {p.name: p for p in incremental.providers}
    assert by_name["child"].root_uuid == b.uuid and "gone" not in by_name
    assert by_name["a"].usages == {} and by_name["a"].traits == {"HW_CPU_X86_AVX"}
    # A resource class rename forces a full rebuild and shows the new name everywhere.
    store.create_resource_class("CUSTOM_OLD")
    gen = store.get_provider(b.uuid).generation  # type: ignore[union-attr]
    store.set_inventories(
        b.uuid, gen, {"CUSTOM_OLD": InventoryRecord("CUSTOM_OLD", 1, 0, 1, 1, 1, 1.0)}, (1, 39)
    )
    store.provider_graph()
    store.rename_resource_class("CUSTOM_OLD", "CUSTOM_NEW")
    renamed = {p.name: p for p in store.provider_graph().providers}
    assert set(renamed["b"].inventories) == {"CUSTOM_NEW"}


def test_graph_is_kept_when_a_write_changes_nothing_it_holds(tmp_path: Path) -> None:
    store = PlacementStore(db.prepare(str(tmp_path / "keep.sqlite")))
    rp = store.create_provider("keep", None, None)
    first = store.provider_graph()
    store.set_provider_traits(rp.uuid, [], 0)  # same (empty) set: no provider change
    assert store.provider_graph() is first
    store.ensure_trait("CUSTOM_NEW_NAME")  # a new known trait name needs a new graph
    second = store.provider_graph()
    assert second is not first and "CUSTOM_NEW_NAME" in second.known_traits
