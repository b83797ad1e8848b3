"""Every provider's capacity and usage per class, read in bulk.

What a whole-cloud reading needs (a replay's ledger, ``berth capacity``'s free amounts):
per provider its root, its capacity per class as placement computes it
(``int((total - reserved) * allocation_ratio)``) and what is used of it. Read from a
store in process through its provider graph (the snapshot allocation candidates come
from: one read, current as of the call), or through a Placement API, which has no call
for all providers: one ``GET /resource_providers``, then each provider's inventories and
usages, a few providers at a time.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from berth.placement.candidates_graph import capacity_of
from berth.placement.client import PlacementClient, ResourceProvider

#: Providers read at once through the API.
API_READERS = 8


@dataclass(frozen=True)
class ProviderAmounts:
    """One provider's capacity per class, what is used of it (classes in use only), and
    the root of its tree."""

    uuid: str
    root_uuid: str
    capacity: dict[str, int]
    used: dict[str, int]


def from_store(store: Any) -> list[ProviderAmounts]:
    """Every provider of a store in process (a :class:`~berth.placement.store.Store`),
    from its provider graph."""
    return [ProviderAmounts(p.uuid, p.root_uuid,
                            {rc: capacity_of(inv) for rc, inv in p.inventories.items()},
                            {rc: int(n) for rc, n in p.usages.items() if n})
            for p in store.provider_graph().providers]


def over_api(client: PlacementClient) -> list[ProviderAmounts]:
    """Every provider through the Placement API, :data:`API_READERS` at a time."""
    providers = client.list_providers()

    def read(p: ResourceProvider) -> ProviderAmounts:
        _, inventory = client.get_inventories(p.uuid)
        usages = client.provider_usages(p.uuid)
        return ProviderAmounts(
            p.uuid, p.root_provider_uuid or p.uuid,
            {rc: int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
             for rc, inv in inventory.items()},
            {rc: int(amount) for rc, amount in usages.items() if amount})

    with ThreadPoolExecutor(API_READERS) as pool:
        return list(pool.map(read, providers))
