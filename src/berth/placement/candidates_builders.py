"""Small builders for provider graphs, used by the candidate tests and the benchmark.

    b = GraphBuilder()
    cn = b.provider("cn1", VCPU=inv(8), MEMORY_MB=inv(4096), used={"VCPU": 2})
    b.provider("numa0", parent=cn, traits={"HW_NUMA_ROOT"}, CUSTOM_VF=inv(8))
    graph = b.graph()

Provider uuids are derived from names (uuid5), so tests can refer to ``b.uuid("cn1")``.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import os_resource_classes
import os_traits

from berth.placement.candidates_graph import Inventory, Provider, ProviderGraph

MAX_INT = 2147483647
_NAMESPACE = uuidlib.UUID("6f1b5a56-3c3e-4c1e-9d57-6d5f2f2b9a11")


def inv(
    total: int,
    *,
    reserved: int = 0,
    min_unit: int = 1,
    max_unit: int = MAX_INT,
    step_size: int = 1,
    allocation_ratio: float = 1.0,
) -> Inventory:
    """An inventory record with the API's defaults; the class is filled in by the builder."""
    return Inventory("", total, reserved, min_unit, max_unit, step_size, allocation_ratio)


def agg_uuid(name: str) -> str:
    """A stable aggregate uuid for a readable name."""
    return str(uuidlib.uuid5(_NAMESPACE, "agg:" + name))


@dataclass(slots=True)
class _Row:
    uuid: str
    name: str
    parent: str | None
    inventories: dict[str, Inventory]
    used: dict[str, int]
    traits: set[str]
    aggregates: set[str]


@dataclass(slots=True)
class GraphBuilder:
    """Collects providers (in creation order) and builds a ``ProviderGraph``."""

    rows: list[_Row] = field(default_factory=list)
    custom_traits: set[str] = field(default_factory=set)
    custom_classes: list[str] = field(default_factory=list)

    def uuid(self, name: str) -> str:
        """The uuid the builder gives the provider called ``name``."""
        return str(uuidlib.uuid5(_NAMESPACE, name))

    def provider(
        self,
        name: str,
        *,
        parent: str | None = None,
        used: dict[str, int] | None = None,
        traits: Iterable[str] = (),
        aggregates: Iterable[str] = (),
        uuid: str | None = None,
        **inventories: Inventory,
    ) -> str:
        """Add a provider; keyword inventories are ``CLASS=inv(...)``. Returns its uuid."""
        rp_uuid = uuid or self.uuid(name)
        invs = {}
        for rc, record in inventories.items():
            invs[rc] = Inventory(
                rc,
                record.total,
                record.reserved,
                record.min_unit,
                record.max_unit,
                record.step_size,
                record.allocation_ratio,
            )
            if rc not in os_resource_classes.STANDARDS and rc not in self.custom_classes:
                self.custom_classes.append(rc)
        trait_set = set(traits)
        self.custom_traits.update(t for t in trait_set if t.startswith("CUSTOM_"))
        self.rows.append(
            _Row(rp_uuid, name, parent, invs, dict(used or {}), trait_set, set(aggregates))
        )
        return rp_uuid

    def graph(self, *, extra_traits: Iterable[str] = ()) -> ProviderGraph:
        """The immutable graph of everything added so far."""
        by_uuid = {r.uuid: r for r in self.rows}

        def root_of(row: _Row) -> str:
            while row.parent is not None:
                row = by_uuid[row.parent]
            return row.uuid

        providers = [
            Provider(
                uuid=r.uuid,
                name=r.name,
                generation=1,
                parent_uuid=r.parent,
                root_uuid=root_of(r),
                inventories=r.inventories,
                usages=r.used,
                traits=frozenset(r.traits),
                aggregates=frozenset(r.aggregates),
            )
            for r in self.rows
        ]
        traits = [*os_traits.get_traits(), *sorted(self.custom_traits), *extra_traits]
        classes = [*os_resource_classes.STANDARDS, *self.custom_classes]
        return ProviderGraph(providers, traits, classes)
