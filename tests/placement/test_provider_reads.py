"""The raw reads of one provider (traits, aggregates, inventories, usages) answer what
the general path answers, on SQLite and on PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest

from berth.placement import provider_reads
from berth.placement.local import LocalPlacement
from berth.placement.store import InventoryRecord, PlacementStore

V = (1, 39)


def _general(store: PlacementStore, read: Callable[[], Any],
             monkeypatch: pytest.MonkeyPatch) -> Any:
    """``read()`` with the raw reads turned off (each falls back to the general path)."""
    def fallback(*_args: Any) -> Any:
        raise provider_reads.Fallback

    with monkeypatch.context() as m:
        for name in ("traits", "aggregates", "inventories", "usages"):
            m.setattr(provider_reads, name, fallback)
        return read()


def test_the_raw_reads_answer_as_the_general_path(engine: Any,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    store = PlacementStore(engine)
    root, child, bare = (str(uuid.uuid4()) for _ in range(3))
    store.create_provider(f"root-{root[:8]}", root, None)
    store.create_provider(f"child-{child[:8]}", child, root)
    store.create_provider(f"bare-{bare[:8]}", bare, None)
    store.create_resource_class("CUSTOM_GPU", exists_ok=True)
    store.ensure_trait("CUSTOM_FAST")
    gen, _ = store.set_inventories(root, 0, {
        "VCPU": InventoryRecord("VCPU", 32, 2, 1, 32, 1, 4.0),
        "MEMORY_MB": InventoryRecord("MEMORY_MB", 65536, 512, 1, 65536, 1, 1.5),
        "CUSTOM_GPU": InventoryRecord("CUSTOM_GPU", 4, 0, 1, 2, 1, 1.0)}, V)
    result = store.set_provider_traits(root, ["HW_CPU_X86_AVX2", "CUSTOM_FAST"], gen)
    assert result is not None
    aggs = sorted(str(uuid.uuid4()) for _ in range(2))
    store.set_aggregates(root, aggs, result[0])
    LocalPlacement(store).put_allocations(
        str(uuid.uuid4()), {root: {"VCPU": 3, "CUSTOM_GPU": 1}}, project_id="p",
        user_id="u", consumer_generation=None)
    missing = str(uuid.uuid4())
    reads: dict[str, Callable[[str], Any]] = {
        "traits": store.get_provider_traits, "aggregates": store.find_aggregates,
        "inventories": store.get_inventories, "usages": store.provider_usages}
    for what, read in reads.items():
        for rp in (root, child, bare, missing):
            statements = store.raw_statements
            fast = read(rp)
            assert store.raw_statements == statements + 1  # one statement, no fallback
            assert fast == _general(store, lambda r=rp, f=read: f(r), monkeypatch), (what, rp)
            assert (fast is None) == (rp == missing)
    _, usages = store.provider_usages(root)  # type: ignore[misc]
    assert usages == {"VCPU": 3, "MEMORY_MB": 0, "CUSTOM_GPU": 1}
    prov, names = store.get_provider_traits(child)  # type: ignore[misc]
    assert (prov.parent_uuid, prov.root_uuid, names) == (root, root, [])
    assert store.find_aggregates(root)[1] == aggs  # type: ignore[index]
