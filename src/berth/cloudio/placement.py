"""Read every resource provider of a Placement API: inventories, traits, aggregates and
the allocations held on it.

One reader for both sources: it takes ``get(path) -> JSON`` (OpenStack's Placement
through openstacksdk, or a running Berth's ``/placement`` through httpx), always at
:data:`MICROVERSION`, which has ``parent_provider_uuid``/``root_provider_uuid`` (1.14)
and the aggregates' generation (1.19). A provider deleted while it is read (404) is
left out with a warning; anything else the API refuses stops the import.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from berth.cloudio.state import CloudState, Provider, names_list
from berth.errors import CloudSourceError

#: The Placement microversion every read is made at.
MICROVERSION = "1.39"

Get = Callable[[str], Any]

_PROVIDER_FIELDS = {"uuid", "name", "generation", "parent_provider_uuid",
                    "root_provider_uuid", "links"}


def read_providers(get: Get, state: CloudState) -> list[Provider]:
    """Every provider with its inventories, traits, aggregates and allocations."""
    body = get("/resource_providers")
    items = body.get("resource_providers") if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise CloudSourceError("placement: GET /resource_providers did not answer a list of "
                               "resource_providers")
    providers: list[Provider] = []
    unknown: dict[str, list[str]] = {}
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("uuid"), str):
            state.warn(f"placement: a resource provider without a uuid ({_show(item)}); "
                       "left out")
            continue
        uuid = item["uuid"]
        name = str(item["name"]) if isinstance(item.get("name"), str) else uuid
        for key in sorted(set(item) - _PROVIDER_FIELDS):
            unknown.setdefault(key, []).append(name)
        provider = Provider(uuid=uuid, name=name, parent_uuid=item.get("parent_provider_uuid"),
                            root_uuid=item.get("root_provider_uuid") or uuid)
        try:
            _fill(provider, get, state)
        except CloudSourceError as exc:
            if exc.details.get("status") != 404:
                raise
            state.warn(f"resource provider {name} ({uuid}): deleted while it was read; "
                       "left out")
            continue
        except (AttributeError, TypeError, ValueError) as exc:
            state.warn(f"resource provider {name} ({uuid}): unreadable ({exc}); left out")
            continue
        providers.append(provider)
    for key, names in sorted(unknown.items()):
        state.warn(f"resource providers {names_list(names)}: unknown field {key!r}; ignored")
    return providers


def _fill(provider: Provider, get: Get, state: CloudState) -> None:
    base = f"/resource_providers/{provider.uuid}"
    where = f"resource provider {provider.name}"
    inventories = get(base + "/inventories").get("inventories") or {}
    for rc, inv in sorted(inventories.items()):
        if not isinstance(inv, dict) or not _is_int(inv.get("total")):
            state.warn(f"{where}: inventory {rc}: no integer total ({_show(inv)}); left out")
            continue
        provider.inventories[rc] = {
            "total": int(inv["total"]), "reserved": int(inv.get("reserved") or 0),
            "min_unit": int(inv.get("min_unit") or 1),
            "max_unit": int(inv.get("max_unit") or inv["total"]),
            "step_size": int(inv.get("step_size") or 1),
            "allocation_ratio": float(inv.get("allocation_ratio") or 1.0)}
    provider.traits = sorted(str(t) for t in get(base + "/traits").get("traits") or [])
    provider.aggregates = sorted(str(a) for a in get(base + "/aggregates").get("aggregates") or [])
    allocations = get(base + "/allocations").get("allocations") or {}
    for consumer, held in sorted(allocations.items()):
        resources = held.get("resources") if isinstance(held, dict) else None
        if not isinstance(resources, dict):
            state.warn(f"{where}: allocation of consumer {consumer}: no resources; left out")
            continue
        provider.allocations[str(consumer)] = {
            str(rc): int(v) for rc, v in resources.items() if _is_int(v)}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

