"""From what was read (:class:`~berth.cloudio.state.CloudState`) to a cloud file.

A host entry joins a compute node with its Placement tree:

* the root provider (uuid = the compute node's, else named as the node) gives the
  standard inventories: VCPU → ``vcpus``, MEMORY_MB → ``memory_mb``, DISK_GB →
  ``local_gb``, each with its allocation ratio and ``*_used`` = what all consumers hold
  plus the inventory's ``reserved`` (the compute counts the reserved amount as used,
  Placement does not; the loader subtracts the configured ``reserved_host_*`` again);
* PCPU → ``cpu_dedicated_set`` (the CPUs the NUMA topology marks dedicated, else a range
  after the shared ones), every other class → ``resources``, the traits (but
  ``COMPUTE_STATUS_DISABLED``, which is the service's state) → ``traits``, and the
  providers below the root → ``providers`` (each naming its ``parent``);
* roots that are no compute node but carry ``MISC_SHARES_VIA_AGGREGATE`` become
  ``sharing_providers``, their aggregates named by the host aggregate of the same uuid.

Fields the cloud-file loader of this Berth does not accept are left out with one
warning, so the file always loads: :func:`to_document` ends by loading the document
with :func:`berth.cloudfile.parse_cloud`. Bad data (an unknown image property value, a
server on no known host, an aggregate naming a missing host) is left out with a one-line
warning that names the object.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections.abc import Mapping
from typing import Any

import yaml

from berth import cloudfile
from berth.cloudio.state import CloudState, ComputeNode, Provider, names_list
from berth.config import SchedulerConfig
from berth.errors import CloudFileError, ImagePropertyError, InputError
from berth.model.request import ImageMetaProps, InstanceGroup

#: Placement's standard classes and the host fields they fill.
STANDARD = (("VCPU", "vcpus", "vcpus_used", "cpu_allocation_ratio", "reserved_host_cpus"),
            ("MEMORY_MB", "memory_mb", "memory_mb_used", "ram_allocation_ratio",
             "reserved_host_memory_mb"),
            ("DISK_GB", "local_gb", "local_gb_used", "disk_allocation_ratio",
             "reserved_host_disk_mb"))
SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
STATUS_DISABLED_TRAIT = "COMPUTE_STATUS_DISABLED"
#: Inventory fields left out of ``resources`` when they hold Placement's default.
INVENTORY_DEFAULTS = {"reserved": 0, "min_unit": 1, "step_size": 1, "allocation_ratio": 1.0}
#: Host fields that carry what Placement knows beyond the standard classes.
PLACEMENT_HOST_FIELDS = ("cpu_dedicated_set", "resources", "traits", "providers")


def to_document(state: CloudState, config: SchedulerConfig | None = None) -> dict[str, Any]:
    """The cloud-file document of ``state`` (warnings go to ``state.warnings``), with
    what this Berth's loader does not accept left out, checked to load.

    Raises :class:`~berth.errors.CloudFileError` if the document would not load, which
    means a bug here rather than bad data (bad data is left out with a warning).
    """
    config = config or SchedulerConfig.default()
    doc = build_document(state, config)
    _leave_out_unknown_fields(doc, state)
    try:
        cloudfile.parse_cloud(doc, config, time.time())
    except CloudFileError as exc:
        raise CloudFileError(f"the cloud read from {state.source} does not load as a cloud "
                             f"file: {exc.message}") from None
    return doc


def build_document(state: CloudState, config: SchedulerConfig | None = None) -> dict[str, Any]:
    """Everything the emitter writes, Placement's fields included whether or not the
    loader takes them yet (:func:`to_document` is what commands use)."""
    config = config or SchedulerConfig.default()
    flavors = _flavors(state, config)
    images = _images(state)
    hosts = _hosts(state, config, {f["name"] for f in flavors}, {i["name"] for i in images})
    host_names = {h["host"] for h in hosts}
    aggregates = _aggregates(state, host_names)
    sharing = _sharing_providers(state, aggregates)
    _check_mirrored_aggregates(state, aggregates)
    placed = {i["uuid"] for h in hosts for i in h.get("instances", [])}
    groups = _server_groups(state, placed)

    doc: dict[str, Any] = {}
    if state.cells:
        doc["cells"] = state.cells
    doc["hosts"] = hosts
    if aggregates:
        doc["aggregates"] = aggregates
    if sharing:
        doc["sharing_providers"] = sharing
    if flavors:
        doc["flavors"] = flavors
    if images:
        doc["images"] = images
    if groups:
        doc["server_groups"] = groups
    return doc


# --------------------------------------------------------------------------- flavors, images
def _probe(section: str, entry: dict[str, Any], config: SchedulerConfig) -> str | None:
    """The loader's complaint about one entry of ``section``, or None: an error, or a
    problem it keeps (a loader that lets a bad entry fail only the requests naming it)."""
    try:
        cloud = cloudfile.parse_cloud({"hosts": [{"host": "probe"}], section: [entry]},
                                      config, 0.0)
    except CloudFileError as exc:
        return exc.message.removeprefix(f"{section}[0].")
    problems = getattr(cloud, "problems", None) or []
    return str(problems[0]).removeprefix(f"{section}[0].") if problems else None


def _flavors(state: CloudState, config: SchedulerConfig) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for entry in state.flavors:
        name = str(entry.get("name"))
        problem = _probe("flavors", entry, config)
        if problem is None and name in seen:
            problem = "a second flavor of that name"
        if problem is not None:
            state.warn(f"flavor {name} ({entry.get('flavorid', '-')}): {problem}; left out")
            continue
        seen.add(name)
        out.append(entry)
    return out


def _images(state: CloudState) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for entry in state.images:
        name = entry["name"]
        properties = dict(entry.get("properties") or {})
        while True:
            try:
                ImageMetaProps(properties)
                break
            except ImagePropertyError as exc:
                state.warn(f"image {name} ({entry.get('id')}): property {exc.key}: "
                           f"{exc.problem}, got {exc.value!r}; left out")
                properties.pop(exc.key, None)
        cleaned = {k: v for k, v in entry.items() if v is not None and k != "properties"}
        if properties:
            cleaned["properties"] = properties
        out.append(cleaned)
    return out


# --------------------------------------------------------------------------- hosts
def _hosts(state: CloudState, config: SchedulerConfig, flavors: set[str],
           images: set[str]) -> list[dict[str, Any]]:
    by_uuid = {p.uuid: p for p in state.providers}
    roots_by_name = {p.name: p for p in state.providers if p.root_uuid in (None, p.uuid)}
    children: dict[str, list[Provider]] = {}
    for p in state.providers:
        if p.root_uuid not in (None, p.uuid):
            children.setdefault(p.root_uuid or "", []).append(p)
    reserved_differs: dict[tuple[str, int], list[str]] = {}

    entries: list[dict[str, Any]] = []
    keys: dict[tuple[str, str], dict[str, Any]] = {}
    for node in sorted(state.nodes, key=lambda n: (n.host, n.nodename)):
        if (node.host, node.nodename) in keys:
            state.warn(f"compute node {node.nodename} of host {node.host}: listed twice; "
                       "the second left out")
            continue
        root = (by_uuid.get(node.uuid) if node.uuid else None) or roots_by_name.get(node.nodename)
        entry = _host_entry(node, root, children, config, reserved_differs, state)
        keys[(node.host, node.nodename)] = entry
        entries.append(entry)
    for (rc, reserved), names in sorted(reserved_differs.items()):
        option = next(s[4] for s in STANDARD if s[0] == rc)
        state.warn(f"compute nodes {names_list(names)}: {rc} reserved {reserved} differs from "
                   f"[DEFAULT] {option} ({getattr(config, option)}) of the configuration, "
                   f"and a cloud file holds no per-host reserved amount: schedule with a "
                   f"nova.conf that sets {option}")
    _place_servers(state, keys, flavors, images)
    return entries


def _host_entry(node: ComputeNode, root: Provider | None, children: dict[str, list[Provider]],
                config: SchedulerConfig, reserved_differs: dict[tuple[str, int], list[str]],
                state: CloudState) -> dict[str, Any]:
    entry: dict[str, Any] = {"host": node.host}
    if node.nodename != node.host:
        entry["nodename"] = node.nodename
    if node.uuid:
        entry["uuid"] = node.uuid
    fields = dict(node.fields)
    for key in ("cell", "host_ip", "hypervisor_type", "hypervisor_version"):
        if fields.get(key) is not None:
            entry[key] = fields.pop(key)
    if root is None:
        state.warn(f"compute node {node.nodename} of host {node.host}: no resource provider "
                   "in placement; its size comes from the compute API"
                   + ("" if node.capacity else ", which gives none (0 CPUs, RAM and disk)"))
        entry.update(node.capacity)
    else:
        entry.update(_standard_inventories(root, node, config, reserved_differs))
        entry.update(_placement_fields(root, children.get(root.uuid, []), entry, fields, state))
    entry.update({k: v for k, v in fields.items() if v is not None})
    service = {k: v for k, v in node.service.items()
               if v is not None and not (k in ("disabled", "forced_down") and v is False)
               and not (k == "up" and v is True)}
    if service:
        entry["service"] = service
    return entry


def _standard_inventories(root: Provider, node: ComputeNode, config: SchedulerConfig,
                          reserved_differs: dict[tuple[str, int], list[str]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rc, size, used, ratio, option in STANDARD:
        inventory = root.inventories.get(rc)
        if inventory is None:
            out[size] = 0
            continue
        out[size] = inventory["total"]
        out[used] = root.used(rc) + inventory["reserved"]
        out[ratio] = inventory["allocation_ratio"]
        configured = getattr(config, option)
        if rc == "DISK_GB":
            configured = math.ceil(configured / 1024)
        if inventory["reserved"] != min(configured, inventory["total"]):
            reserved_differs.setdefault((rc, inventory["reserved"]), []).append(node.nodename)
    if "PCPU" in root.inventories:
        # A compute counts every instance's vCPUs as used, pinned (PCPU) ones too.
        out["vcpus_used"] = out.get("vcpus_used", 0) + root.used("PCPU")
    return out


def _placement_fields(root: Provider, below: list[Provider], entry: dict[str, Any],
                      fields: dict[str, Any], state: CloudState) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pcpu = root.inventories.get("PCPU")
    if pcpu is not None:
        out["cpu_dedicated_set"] = _dedicated_set(pcpu["total"], entry.get("vcpus", 0),
                                                  fields.get("numa_topology"))
    resources = {rc: _inventory(inv) for rc, inv in root.inventories.items()
                 if rc not in ("VCPU", "MEMORY_MB", "DISK_GB", "PCPU")}
    if resources:
        out["resources"] = resources
    # Written even when empty: a host entry without ``traits`` gets the ones its
    # driver would report, which this provider does not have.
    out["traits"] = [t for t in root.traits if t != STATUS_DISABLED_TRAIT]
    # The loader names a nested entry NAME "<node>_NAME" (Nova's own children are named
    # so) and takes ``parent`` as another entry's name, none for the root.
    names: dict[str, str | None] = {root.uuid: None}
    nested = []
    for child in _tree_order(root, below):
        name = child.name.removeprefix(f"{root.name}_") or child.name
        names[child.uuid] = name
        item: dict[str, Any] = {"name": name}
        parent = names.get(child.parent_uuid or "")
        if parent is not None:
            item["parent"] = parent
        if child.inventories:
            item["resources"] = {rc: _inventory(inv) for rc, inv in child.inventories.items()}
        if child.traits:
            item["traits"] = list(child.traits)
        nested.append(item)
    if nested:
        out["providers"] = nested
    return out


def _tree_order(root: Provider, below: list[Provider]) -> list[Provider]:
    """The providers under ``root``, each after its parent."""
    order: list[Provider] = []
    parents = {root.uuid}
    pending = sorted(below, key=lambda p: p.name)
    while pending:
        ready = [p for p in pending if p.parent_uuid in parents]
        if not ready:  # a parent outside the tree: keep them, under the root
            ready = pending
        for p in ready:
            order.append(p)
            parents.add(p.uuid)
        pending = [p for p in pending if p not in ready]
    return order


def _inventory(inv: Mapping[str, Any]) -> dict[str, Any]:
    """An inventory without the fields that hold Placement's defaults."""
    return {k: v for k, v in inv.items() if INVENTORY_DEFAULTS.get(k, object()) != v}


def _dedicated_set(count: int, shared: int, numa: Any) -> str:
    """The host's dedicated CPUs: the NUMA cells' ``pcpuset`` when they hold ``count``
    CPUs, else the ``count`` CPUs numbered after the ``shared`` ones."""
    from berth.hardware.numa import format_cpu_spec

    if isinstance(numa, Mapping):
        cpus = {int(c) for cell in numa.get("cells") or [] for c in cell.get("pcpuset") or []}
        if len(cpus) == count:
            return format_cpu_spec(cpus)
    return format_cpu_spec(range(shared, shared + count))


def _place_servers(state: CloudState, keys: dict[tuple[str, str], dict[str, Any]],
                   flavors: set[str], images: set[str]) -> None:
    nodes_of: dict[str, list[str]] = {}
    for host, nodename in keys:
        nodes_of.setdefault(host, []).append(nodename)
    unplaced = 0
    for server in sorted(state.servers, key=lambda s: s.uuid):
        if server.host is None:
            unplaced += 1
            continue
        node = server.nodename or ""
        if (server.host, node) not in keys:
            if len(nodes_of.get(server.host, [])) != 1:
                state.warn(f"server {server.uuid}: runs on {server.host}/{server.nodename}, "
                           "which is no compute node read; left out")
                continue
            node = nodes_of[server.host][0]
        item: dict[str, Any] = {"uuid": server.uuid}
        if server.flavor is not None:
            if server.flavor in flavors:
                item["flavor"] = server.flavor
            else:
                state.warn(f"server {server.uuid}: flavor {server.flavor!r} is not among the "
                           "flavors read (deleted?); written without one")
        if server.image is not None:
            if server.image in images:
                item["image"] = server.image
            else:
                state.warn(f"server {server.uuid}: image {server.image!r} is not among the "
                           "images read (deleted?); written without one")
        if server.project_id:
            item["project_id"] = server.project_id
        keys[(server.host, node)].setdefault("instances", []).append(item)
    if unplaced:
        state.warn(f"{unplaced} server(s) on no host (never scheduled, or shelved "
                   "offloaded): left out")


# --------------------------------------------------------------------------- aggregates
def _aggregates(state: CloudState, host_names: set[str]) -> list[dict[str, Any]]:
    out = []
    for agg in state.aggregates:
        hosts = []
        for host in agg.get("hosts") or []:
            if host in host_names:
                hosts.append(host)
            else:
                state.warn(f"aggregate {agg['name']}: host {host!r} is no compute host read; "
                           "left out of it")
        entry = {k: v for k, v in agg.items() if k != "hosts" and v not in (None, {}, [])}
        entry["hosts"] = hosts
        out.append(entry)
    return out


def _sharing_providers(state: CloudState, aggregates: list[dict[str, Any]]) -> list[dict[str, Any]]:
    node_uuids = {n.uuid for n in state.nodes if n.uuid}
    node_names = {n.nodename for n in state.nodes}
    names = {a["uuid"]: a["name"] for a in aggregates if a.get("uuid")}
    out = []
    for p in state.providers:
        if p.root_uuid not in (None, p.uuid) or p.uuid in node_uuids or p.name in node_names:
            continue
        if SHARING_TRAIT not in p.traits:
            state.warn(f"resource provider {p.name} ({p.uuid}): neither a compute node nor "
                       f"shared ({SHARING_TRAIT}); left out")
            continue
        agg_names = []
        for agg_uuid in p.aggregates:
            if agg_uuid not in names:
                name = f"placement-{agg_uuid}"
                names[agg_uuid] = name
                members = sorted({n.host for n in state.nodes for q in state.providers
                                  if q.uuid == n.uuid and agg_uuid in q.aggregates})
                aggregates.append({"name": name, "uuid": agg_uuid, "hosts": members})
                state.warn(f"sharing provider {p.name}: placement aggregate {agg_uuid} is no "
                           f"host aggregate; written as aggregate {name}")
            agg_names.append(names[agg_uuid])
        entry: dict[str, Any] = {"name": p.name, "uuid": p.uuid}
        if p.inventories:
            entry["resources"] = {rc: _inventory(inv) for rc, inv in p.inventories.items()}
        traits = [t for t in p.traits if t != SHARING_TRAIT]
        if traits:
            entry["traits"] = traits
        entry["aggregates"] = agg_names
        out.append(entry)
    return out


def _check_mirrored_aggregates(state: CloudState, aggregates: list[dict[str, Any]]) -> None:
    """Warn where a host aggregate and its placement aggregate (same uuid) disagree on
    a compute node: Nova mirrors one into the other; the file follows the host aggregate."""
    by_uuid = {p.uuid: p for p in state.providers}
    for agg in aggregates:
        uuid = agg.get("uuid")
        if not uuid or agg["name"].startswith("placement-"):
            continue
        listed = set(agg["hosts"])
        odd = []
        for node in state.nodes:
            provider = by_uuid.get(node.uuid or "")
            if provider is None:
                continue
            if (uuid in provider.aggregates) != (node.host in listed):
                odd.append(node.nodename)
        if odd:
            state.warn(f"aggregate {agg['name']}: placement's membership differs for compute "
                       f"nodes {names_list(odd)}; the file follows the host aggregate")


# --------------------------------------------------------------------------- server groups
def _server_groups(state: CloudState, placed: set[str]) -> list[dict[str, Any]]:
    out = []
    for group in state.server_groups:
        name = group.get("name")
        where = f"server group {name} ({group.get('uuid')})"
        if group.get("policy") not in InstanceGroup.VALID_POLICIES:
            state.warn(f"{where}: policy {group.get('policy')!r} is not one of "
                       f"{', '.join(InstanceGroup.VALID_POLICIES)}; left out")
            continue
        entry = {k: v for k, v in group.items() if v not in (None, {}, [])}
        rules = dict(group.get("rules") or {})
        for key in sorted(set(rules) - {"max_server_per_host"}):
            state.warn(f"{where}: rule {key!r} is not known; left out")
            rules.pop(key)
        if rules:
            entry["rules"] = rules
        else:
            entry.pop("rules", None)
        members = [m for m in group.get("members") or [] if m in placed]
        gone = len(group.get("members") or []) - len(members)
        if gone:
            state.warn(f"{where}: {gone} member(s) run on no compute node read; left out")
        entry["members"] = members
        out.append(entry)
    return out


# --------------------------------------------------------------------------- the loader's fields
def _leave_out_unknown_fields(doc: dict[str, Any], state: CloudState) -> None:
    """Drop what this Berth's cloud-file loader does not accept, saying what."""
    for key in PLACEMENT_HOST_FIELDS:
        if key in cloudfile.HOST_FIELDS:
            continue
        holders = [h["host"] for h in doc["hosts"] if key in h]
        for h in doc["hosts"]:
            h.pop(key, None)
        if holders:
            state.warn(f"compute nodes {names_list(holders)}: {key} left out (this Berth's cloud "
                       "files do not carry it yet)")
    if "sharing_providers" in doc and "sharing_providers" not in cloudfile.TOP_LEVEL:
        names = [p["name"] for p in doc.pop("sharing_providers")]
        state.warn(f"sharing providers {names_list(names)}: left out (this Berth's cloud files "
                   "do not carry them yet)")


# --------------------------------------------------------------------------- writing
#: libyaml's emitter when PyYAML has it (about ten times faster on a large cloud).
_BaseDumper: Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class _Dumper(_BaseDumper):  # type: ignore[misc,valid-type]
    """Block style, but lists of scalars (traits, features, hosts) on one line."""


def _list(dumper: Any, items: list[Any]) -> yaml.Node:
    flat = all(not isinstance(i, (dict, list)) for i in items) or all(
        isinstance(i, list) and all(not isinstance(j, (dict, list)) for j in i) for i in items)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", items, flow_style=flat)


_Dumper.add_representer(list, _list)


def dump(doc: dict[str, Any], path: str, fmt: str | None = None, header: str = "") -> None:
    """Write ``doc`` to ``path`` (``-`` for stdout) as YAML or JSON: ``fmt`` if given,
    else JSON for a ``.json`` name and YAML otherwise."""
    import sys

    fmt = fmt or ("json" if path.endswith(".json") else "yaml")
    if fmt == "json":
        text = json.dumps(doc, indent=2, sort_keys=False) + "\n"
    elif fmt == "yaml":
        comment = "".join(f"# {line}\n" for line in header.splitlines())
        text = comment + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, allow_unicode=True,
                                   width=100)
    else:
        raise InputError(f"--format {fmt!r}: expected yaml or json")
    if path == "-":
        sys.stdout.write(text)
        return
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise InputError(f"--output {path}: no directory {directory}")
    if os.path.isdir(path):
        raise InputError(f"--output {path}: a directory; give a file name")
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise InputError(f"--output {path}: cannot write it: {exc.strerror or exc}") from None

