"""Read a running ``berth serve`` through its HTTP APIs (``berth cloud export``).

The scheduler API's state routes (``GET /compute-nodes``, ``/aggregates``, ``/flavors``,
``/images``, ``/server-groups``; see :mod:`berth.service.api`) give what the compute
agents reported and what the server knows by name; ``/placement`` gives the providers
(:mod:`berth.cloudio.placement`). A compute record keeps an instance's flavor id and
image properties, not their names: the flavor is the one with that id (the one whose
size matches the instance's allocation when several share it), the image the first
whose properties are the instance's.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Mapping
from typing import Any

import httpx

from berth.cloudio import placement
from berth.cloudio.state import CloudState, ComputeNode, Provider, Server
from berth.errors import CloudSourceError
from berth.model.request import Flavor, same_as_default

#: Stats the compute agent derives itself; the file gives them as their own fields.
_OWN_STATS = ("num_instances", "io_workload", "failed_builds")


class BerthAPI:
    """GETs against a running Berth (``url``), Placement under ``/placement`` with a
    noauth2 ``token`` (``admin`` reads everything under the legacy policy)."""

    def __init__(self, url: str, token: str = "admin", timeout: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.Client(base_url=self.url, timeout=timeout, transport=transport,
                                   headers={"X-Auth-Token": token})

    def close(self) -> None:
        """Close the connection pool."""
        self.client.close()

    def get(self, path: str, headers: Mapping[str, str] | None = None) -> Any:
        """``GET path`` as JSON; a refusal or an unreachable server is one-line
        :class:`CloudSourceError` (``details["status"]`` holds the HTTP status)."""
        try:
            resp = self.client.get(path, headers=dict(headers or {}))
        except httpx.HTTPError as exc:
            raise CloudSourceError(f"{self.url}: cannot GET {path}: {exc}") from None
        if resp.status_code != 200:
            hint = (" (is this a berth serve of this version?)"
                    if resp.status_code == 404 and not path.startswith("/placement") else "")
            raise CloudSourceError(f"{self.url}: GET {path} answered {resp.status_code}"
                                   f"{hint}: {resp.text[:200]}", status=resp.status_code)
        try:
            return resp.json()
        except ValueError:
            raise CloudSourceError(f"{self.url}: GET {path} answered no JSON: "
                                   f"{resp.text[:200]!r}") from None

    def placement(self, path: str) -> Any:
        """``GET /placement{path}`` at the reader's microversion."""
        return self.get("/placement" + path, {
            "OpenStack-API-Version": f"placement {placement.MICROVERSION}"})


def read_berth(api: BerthAPI) -> CloudState:
    """Everything a running Berth holds, as a :class:`CloudState`."""
    state = CloudState(source=api.url)
    reports = _list(api.get("/compute-nodes"), "compute_nodes", api.url)
    state.providers = placement.read_providers(api.placement, state)
    flavors = _list(api.get("/flavors"), "flavors", api.url)
    images = _list(api.get("/images"), "images", api.url)
    # Berth's defaults stay out of the file: every cloud knows them (with ids of their
    # own), and the file's flavors keep theirs.
    state.flavors = [_flavor(f) for f in flavors if not _berths_default(f)]
    state.images = [{k: v for k, v in i.items() if v not in (None, {})} for i in images]
    state.aggregates = [_aggregate(a) for a in _list(api.get("/aggregates"), "aggregates", api.url)]
    state.server_groups = [
        {k: g.get(k) for k in ("name", "uuid", "policy", "rules", "members", "project_id")}
        for g in _list(api.get("/server-groups"), "server_groups", api.url)]
    cells: list[str] = []
    allocations = _allocations_by_consumer(state.providers)
    for report in reports:
        try:
            node = _node(report)
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            state.warn(f"compute node report {report.get('uuid') if isinstance(report, dict) else report!r}: "
                       f"unreadable ({exc}); left out")
            continue
        state.nodes.append(node)
        cell = report.get("cell_uuid")
        if cell:
            node.fields["cell"] = cell
            if cell not in cells:
                cells.append(cell)
        for inst in report.get("instances") or []:
            image = _image_of(inst.get("image_properties") or {}, images)
            if image is None and inst.get("image_properties"):
                state.warn(f"instance {inst['uuid']} on {node.nodename}: its image properties "
                           "match no image the server knows; written without an image")
            state.servers.append(Server(
                uuid=inst["uuid"], host=node.host, nodename=node.nodename,
                flavor=_flavor_of(inst.get("instance_type_id"), flavors,
                                  allocations.get(inst["uuid"], {})),
                image=image, project_id=inst.get("project_id")))
    state.cells = _cells(api, cells)
    names = {c["uuid"]: c["name"] for c in state.cells}
    for node in state.nodes:
        if "cell" in node.fields:
            node.fields["cell"] = names.get(node.fields["cell"], node.fields["cell"])
    return state


def _cells(api: Any, seen: list[str]) -> list[dict[str, Any]]:
    """The server's cell mappings (``GET /cells``: names and disabled flags), then any
    cell a host names that has none, under its uuid. A server older than the route
    answers 404: every cell then goes under its uuid."""
    try:
        known = _list(api.get("/cells"), "cells", api.url)
    except CloudSourceError as exc:
        if exc.details.get("status") != 404:
            raise
        known = []
    out = [{"name": c["name"], "uuid": c["uuid"], **({"disabled": True} if c.get("disabled") else {})}
           for c in known]
    named = {c["uuid"] for c in out}
    out += [{"name": c, "uuid": c} for c in seen if c not in named]
    return out


def _list(body: Any, key: str, url: str) -> list[dict[str, Any]]:
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list):
        raise CloudSourceError(f"{url}: the answer holds no list {key!r}")
    return items


def _berths_default(data: Mapping[str, Any]) -> bool:
    """Whether a listed flavor is one of Berth's defaults: as the server says, or (a
    server that does not say) exactly a default with its usual id."""
    if "berth_default" in data:
        return bool(data["berth_default"])
    try:
        flavor = Flavor(name=str(data.get("name")), vcpus=int(data.get("vcpus") or 0),
                        memory_mb=int(data.get("memory_mb") or 0),
                        root_gb=int(data.get("root_gb") or 0),
                        ephemeral_gb=int(data.get("ephemeral_gb") or 0),
                        swap=int(data.get("swap") or 0), id=data.get("id"),
                        extra_specs=dict(data.get("extra_specs") or {}))
    except (TypeError, ValueError):
        return False
    return same_as_default(flavor)


def _flavor(data: Mapping[str, Any]) -> dict[str, Any]:
    entry = {k: data.get(k) for k in ("name", "id", "flavorid", "vcpus", "memory_mb", "root_gb",
                                      "ephemeral_gb", "swap", "extra_specs")}
    if entry["flavorid"] == entry["name"]:
        entry.pop("flavorid")
    return {k: v for k, v in entry.items() if v not in (None, {}, 0) or k in ("vcpus",)}


def _aggregate(data: Mapping[str, Any]) -> dict[str, Any]:
    metadata = dict(data.get("metadata") or {})
    entry: dict[str, Any] = {"name": data["name"], "id": data.get("id"), "uuid": data.get("uuid")}
    zone = metadata.pop("availability_zone", None)
    if zone is not None:
        entry["availability_zone"] = zone
    entry["metadata"] = metadata
    entry["hosts"] = list(data.get("hosts") or [])
    return entry


def _node(report: Mapping[str, Any]) -> ComputeNode:
    """A compute node from its stored report (what the agent published)."""
    host = str(report["host"])
    nodename = str(report.get("nodename") or host)
    fields: dict[str, Any] = {}
    for key in ("host_ip", "hypervisor_type", "hypervisor_version", "supported_instances",
                "numa_topology"):
        if report.get(key) not in (None, [], {}):
            fields[key] = report[key]
    if report.get("hypervisor_hostname") not in (None, nodename):
        fields["hypervisor_hostname"] = report["hypervisor_hostname"]
    cpu_info = report.get("cpu_info")
    if isinstance(cpu_info, str):
        with contextlib.suppress(ValueError):  # else kept as the text the compute reported
            cpu_info = json.loads(cpu_info)
    if cpu_info not in (None, {}, "{}"):
        fields["cpu_info"] = cpu_info
    if report.get("pci_stats"):
        fields["pci_pools"] = report["pci_stats"]
    metrics = report.get("metrics") or []
    if metrics:
        if any(m.get("source") for m in metrics):
            fields["metrics"] = [{k: m[k] for k in ("name", "value", "source") if m.get(k) is not None}
                                 for m in metrics]
        else:
            fields["metrics"] = {m["name"]: m["value"] for m in metrics}
    stats = {str(k): str(v) for k, v in (report.get("stats") or {}).items()}
    instances = report.get("instances") or []
    if stats.get("num_instances") == str(len(instances)):
        stats.pop("num_instances")
    for own in ("io_workload", "failed_builds"):
        value = stats.get(own)
        if value is not None and value.isdigit():
            stats.pop(own)
            if int(value):
                fields[own] = int(value)
    if stats:
        fields["stats"] = stats
    ram, disk = int(report.get("total_usable_ram_mb") or 0), int(report.get("total_usable_disk_gb") or 0)
    disk_used_gb = int(report.get("disk_mb_used") or 0) // 1024
    free_disk_mb = report.get("free_disk_mb")
    if free_disk_mb is not None and free_disk_mb < (disk - disk_used_gb) * 1024:
        fields["disk_available_least"] = math.floor(free_disk_mb / 1024)
    service = report.get("service") or {}
    return ComputeNode(
        host=host, nodename=nodename, uuid=report.get("uuid"), fields=fields,
        capacity={"vcpus": int(report.get("vcpus_total") or 0),
                  "vcpus_used": int(report.get("vcpus_used") or 0),
                  "memory_mb": ram, "memory_mb_used": ram - int(report.get("free_ram_mb") or 0),
                  "local_gb": disk, "local_gb_used": disk_used_gb},
        service={"disabled": bool(service.get("disabled")),
                 "disabled_reason": service.get("disabled_reason") if service.get("disabled") else None,
                 "forced_down": bool(service.get("forced_down")),
                 # A compute whose heartbeat is stale is silent ("up: false"); forced
                 # down says the rest.
                 "up": bool(report.get("reporting", True))})


def _allocations_by_consumer(providers: list[Provider]) -> dict[str, dict[str, int]]:
    """Each consumer's amounts summed over the providers it holds resources on."""
    out: dict[str, dict[str, int]] = {}
    for p in providers:
        for consumer, amounts in p.allocations.items():
            mine = out.setdefault(consumer, {})
            for rc, amount in amounts.items():
                mine[rc] = mine.get(rc, 0) + amount
    return out


def _flavor_of(flavor_id: Any, flavors: list[dict[str, Any]], held: Mapping[str, int]) -> str | None:
    """The name of the flavor with ``flavor_id``; among several, the one whose size is
    what the instance holds in placement, else the last listed)."""
    if flavor_id is None:
        return None
    same = [f for f in flavors if f.get("id") == flavor_id]
    sized = [f for f in same
             if held and held.get("VCPU", 0) + held.get("PCPU", 0) == f.get("vcpus")
             and held.get("MEMORY_MB", 0) == f.get("memory_mb")]
    chosen = (sized or same)[-1:]
    return str(chosen[0]["name"]) if chosen else None


def _image_of(properties: Mapping[str, Any], images: list[dict[str, Any]]) -> str | None:
    """The first image whose properties are ``properties`` (none for no properties:
    an image without any is indistinguishable from no image)."""
    if not properties:
        return None
    for image in images:
        if dict(image.get("properties") or {}) == dict(properties):
            return str(image["name"])
    return None
