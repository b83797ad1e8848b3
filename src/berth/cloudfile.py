"""Offline cloud descriptions: a YAML or JSON file to schedule against (dry-run, what-if).

Schema (every section optional except ``hosts``; see docs/cloud-file.md)::

    cells:          [{name, uuid?, disabled?}]
    aggregates:     [{name, hosts: [host names], metadata: {str: str}, availability_zone?}]
    host_defaults:  {any host field}          # merged under every host entry
    hosts:          [{host, nodename?, cell?, uuid?, count?, ...fields}]
    flavors:        [{name, vcpus, memory_mb, root_gb?, ephemeral_gb?, swap?, id?, extra_specs?}]
    images:         [{name, id?, disk_format?, properties?}]
    server_groups:  [{name, policy, rules?, members?: [instance uuids], project_id?}]

A host entry is what the compute node reports: ``vcpus``, ``memory_mb``, ``local_gb``,
optional ``vcpus_used`` / ``memory_mb_used`` / ``local_gb_used`` / ``disk_available_least``
(derived from its ``instances`` and the reserved options when absent), ratios,
``hypervisor_type``/``hypervisor_version``, ``cpu_info`` (a mapping or JSON text),
``supported_instances``, ``stats``, ``metrics``, ``host_ip``, ``service`` (``disabled``,
``disabled_reason``, ``forced_down``, ``up``, ``last_seen_up``), ``numa_topology``,
``pci_pools`` and ``instances`` ([{uuid, flavor?, image?, project_id?}]). ``count: N`` with a
``{index}`` placeholder in ``host`` (or ``nodename``) stamps out N similar hosts (``start: K``
makes the index run from K instead of 1).

Several entries with one ``host`` and different ``nodename`` are the nodes of one service
host (Ironic): one service (given once, in one cell) and one set of instances, which
filters and weighers see on every node of it, as Nova does; each node's usage and
``num_instances`` stay its own.

Every error names the field path and the bad value, e.g.
``hosts[3].memory_mb: expected an integer >= 0, got 'lots'``.
"""

from __future__ import annotations

import functools
import json
import math
import uuid as uuidlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from berth.cloudfile_reader import FieldReader, read_document, show, timestamp
from berth.config import SchedulerConfig
from berth.errors import CloudFileError
from berth.model import (
    Aggregate,
    CellMapping,
    Flavor,
    ImageMeta,
    ImageMetaProps,
    Instance,
    InstanceGroup,
    MetricItem,
    ServiceRecord,
)
from berth.model.image_props import ImagePropertyError
from berth.model.request import DEFAULT_FLAVORS, known_flavors, same_as_default
from berth.placement.bounds import MAX_FLOAT, MAX_INT
from berth.provider_tree import (
    NodeProviders,
    ProviderSpec,
    driver_traits,
    read_nested,
    read_resources,
    read_sharing,
    read_traits,
)
from berth.snapshot import HostRecord, HostSnapshot

_NAMESPACE = uuidlib.UUID("6f1f7d0c-1c55-4f0e-9d1e-6a3f1b0b8e11")

HOST_FIELDS = {
    "host", "nodename", "cell", "uuid", "count", "start", "host_ip", "vcpus", "vcpus_used", "memory_mb",
    "memory_mb_used", "local_gb", "local_gb_used", "disk_available_least",
    "cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio",
    "hypervisor_type", "hypervisor_version", "hypervisor_hostname", "cpu_info",
    "supported_instances", "stats", "metrics", "service", "numa_topology", "pci_pools",
    "instances", "failed_builds", "io_workload", "traits", "resources", "cpu_dedicated_set",
    "providers",
}  # fmt: skip
TOP_LEVEL = {"cells", "aggregates", "host_defaults", "hosts", "flavors", "images", "server_groups",
             "sharing_providers"}


def stable_uuid(*parts: str) -> str:
    """A uuid derived from names, so the same file always gives the same ids."""
    return str(uuidlib.uuid5(_NAMESPACE, "/".join(parts)))


@dataclass
class Cloud:
    """A loaded cloud: the snapshot plus the named flavors, images and server groups."""

    snapshot: HostSnapshot
    flavors: dict[str, Flavor] = field(default_factory=dict)
    images: dict[str, ImageMeta] = field(default_factory=dict)
    server_groups: dict[str, InstanceGroup] = field(default_factory=dict)
    cells: dict[str, CellMapping] = field(default_factory=dict)
    source: str = ""
    #: What Placement holds per compute node (by node uuid) beyond its size.
    providers: dict[str, NodeProviders] = field(default_factory=dict)
    #: Providers that share their resources with the hosts of aggregates.
    sharing: list[ProviderSpec] = field(default_factory=list)
    #: Images whose properties do not parse, by name: requests using one fail.
    broken_images: dict[str, BrokenImage] = field(default_factory=dict)

    def flavor(self, name: str) -> Flavor:
        """The flavor called ``name``: the cloud file's, else one of Berth's defaults
        (``m1.tiny`` ... ``m1.xlarge``, as ``berth serve`` knows them); CloudFileError
        listing the known ones otherwise."""
        found = self.known_flavors().get(name)
        if found is None:
            raise CloudFileError(
                f"unknown flavor {name!r}; the cloud file defines: "
                f"{', '.join(sorted(self.flavors)) or 'none'}; Berth's defaults: "
                f"{', '.join(DEFAULT_FLAVORS)}")
        return found

    def known_flavors(self) -> dict[str, Flavor]:
        """The flavors the cloud knows by name: its own, then Berth's defaults, each
        with an id of its own (see :func:`berth.model.request.known_flavors`)."""
        return known_flavors(self.flavors)

    def own_flavors(self) -> list[str]:
        """The flavors "every flavor of the cloud" means: the cloud file's, or Berth's
        defaults when it defines none."""
        return sorted(self.flavors) or list(DEFAULT_FLAVORS)

    def image(self, name: str) -> ImageMeta:
        """The image called ``name`` (or with that id)."""
        if name in self.images:
            return self.images[name]
        for image in self.images.values():
            if image.id == name:
                return image
        if name in self.broken_images:
            raise CloudFileError(f"image {name!r} cannot be used: "
                                 f"{self.broken_images[name].problem}")
        raise CloudFileError(
            f"unknown image {name!r}; the cloud file defines: {', '.join(sorted(self.images)) or 'none'}"
        )

    def server_group(self, name: str) -> InstanceGroup:
        """The server group called ``name``."""
        try:
            return self.server_groups[name]
        except KeyError:
            raise CloudFileError(
                f"unknown server group {name!r}; the cloud file defines: "
                f"{', '.join(sorted(self.server_groups)) or 'none'}"
            ) from None


# --------------------------------------------------------------------------- loading
#: The most compute nodes one cloud file may describe, ``count`` expanded: ten times the
#: largest cloud Berth is benchmarked at, and a bound on what a typo in ``count`` costs.
MAX_COMPUTE_NODES = 1_000_000


def _bounded_entries(items: Sequence[Any], defaults: Mapping[str, Any]
                     ) -> list[tuple[dict[str, Any], int | None]]:
    """Each ``hosts`` entry merged over ``host_defaults``, with its ``count``; the counts
    are summed and bounded by :data:`MAX_COMPUTE_NODES` before any host is expanded, so a
    typo in a count costs nothing wherever it stands."""
    entries: list[tuple[dict[str, Any], int | None]] = []
    planned = 0
    for i, item in enumerate(items):
        if not isinstance(item, Mapping):
            raise CloudFileError(f"hosts[{i}]: expected a mapping, got {show(item)}")
        merged = {**defaults, **item}
        count = FieldReader(merged, f"hosts[{i}]").integer("count", default=None, minimum=1)
        planned += count or 1
        if planned > MAX_COMPUTE_NODES:
            raise CloudFileError(
                f"hosts[{i}].count: {count} would make {planned:,} compute nodes; a cloud file "
                f"holds at most {MAX_COMPUTE_NODES:,}")
        entries.append((merged, count))
    return entries


def load_cloud(path: str, config: SchedulerConfig | None = None, now: float | None = None) -> Cloud:
    """Load a cloud file into a snapshot (``now`` is the instant 'up' hosts last reported)."""
    document = read_document(path)
    cloud = parse_cloud(document, config or SchedulerConfig.default(), now if now is not None else 0.0)
    cloud.source = path
    return cloud


def parse_cloud(document: Any, config: SchedulerConfig, now: float) -> Cloud:
    """Build a :class:`Cloud` from a parsed document."""
    top = FieldReader(document, "")
    top.unknown(TOP_LEVEL)
    if not top.has("hosts"):
        raise CloudFileError("hosts: required field is missing (a cloud needs at least one host)")

    cells: dict[str, CellMapping] = {}
    for i, item in enumerate(top.seq("cells")):
        r = FieldReader(item, f"cells[{i}]")
        r.unknown({"name", "uuid", "disabled"})
        name = r.text("name", required=True)
        assert name is not None
        if name in cells:
            raise CloudFileError(f"cells[{i}].name: duplicate cell {name!r}")
        cells[name] = CellMapping(uuid=r.text("uuid") or stable_uuid("cell", name), name=name,
                                  disabled=r.flag("disabled"))

    flavors = _flavors(top)
    known = known_flavors(flavors)  # what the hosts' instances may name
    broken: dict[str, BrokenImage] = {}
    images = _images(top, broken)
    defaults = top.mapping("host_defaults")
    FieldReader(defaults, "host_defaults").unknown(HOST_FIELDS - {"host", "count", "start", "uuid"})

    records: list[HostRecord] = []
    seen: set[tuple[str, str]] = set()
    #: The first node of each service host: its path and record.
    first_node: dict[str, tuple[str, HostRecord]] = {}
    node_names: dict[str, str] = {}
    node_uuids: dict[str, str] = {}
    providers: dict[str, NodeProviders] = {}
    entries = _bounded_entries(top.seq("hosts"), defaults)
    for i, (merged, count) in enumerate(entries):
        reader = FieldReader(merged, f"hosts[{i}]")
        start = reader.integer("start", default=1, minimum=0) or 0
        if reader.has("start") and count is None:
            raise CloudFileError(f"hosts[{i}].start: only meaningful with count")
        for index in range(start, start + (count or 1)):
            entry = dict(merged)
            if count is not None:
                entry = _stamp(entry, index, f"hosts[{i}]")
            path = f"hosts[{i}]" if count is None else f"hosts[{i}] (#{index})"
            record = _host(entry, path, cells, known, images, config, now, broken)
            assert record.uuid is not None
            if record.key in seen:
                raise CloudFileError(f"{path}.host: duplicate compute node {record.key[0]}/{record.key[1]}")
            # Placement names a node's provider by its nodename, and knows it by its uuid.
            other = node_names.setdefault(record.nodename or record.host, path)
            if other != path:
                raise CloudFileError(f"{path}.nodename: {record.nodename!r} is also {other}'s "
                                     "(a node's resource provider is named after it)")
            other = node_uuids.setdefault(record.uuid, path)
            if other != path:
                raise CloudFileError(f"{path}.uuid: {record.uuid!r} is also {other}'s")
            providers[record.uuid] = _node_providers(entry, path, record)
            seen.add(record.key)
            if record.host in first_node:
                _same_service_host(record, entry, path, *first_node[record.host])
            else:
                first_node[record.host] = (path, record)
            records.append(record)

    host_names = {r.host for r in records}
    aggregates: list[Aggregate] = []
    for i, item in enumerate(top.seq("aggregates")):
        r = FieldReader(item, f"aggregates[{i}]")
        r.unknown({"name", "hosts", "metadata", "availability_zone", "uuid", "id"})
        name = r.text("name", required=True)
        assert name is not None
        metadata = r.str_map("metadata")
        zone = r.text("availability_zone")
        if zone is not None:
            metadata["availability_zone"] = zone
        hosts = []
        for j, h in enumerate(r.seq("hosts")):
            if not isinstance(h, str):
                raise CloudFileError(f"aggregates[{i}].hosts[{j}]: expected a host name, got {show(h)}")
            if h not in host_names:
                raise CloudFileError(f"aggregates[{i}].hosts[{j}]: no host named {h!r} in hosts")
            hosts.append(h)
        aggregates.append(Aggregate(id=r.integer("id", default=i + 1) or i + 1, name=name,
                                    uuid=r.text("uuid") or stable_uuid("aggregate", name),
                                    hosts=tuple(hosts), metadata=metadata))

    groups = _groups(top, records)
    sharing = read_sharing(top.seq("sharing_providers"), {a.name for a in aggregates})
    for provider in sharing:
        provider.uuid = provider.uuid or stable_uuid("sharing", provider.name)
    snapshot = HostSnapshot.from_records(records, aggregates)
    snapshot.disabled_cells = frozenset(c.uuid for c in cells.values() if c.disabled)
    return Cloud(snapshot, flavors, images, groups, cells, providers=providers, sharing=sharing,
                 broken_images=broken)


@functools.lru_cache(maxsize=256)
def _reported_traits(hypervisor_type: str | None, cpu_info: str) -> tuple[str, ...]:
    """The traits a node's driver reports, from its hypervisor and ``cpu_info`` text
    (once per distinct pair: the hosts a ``count`` stamps out share them)."""
    try:
        cpu = json.loads(cpu_info)
    except ValueError:
        cpu = {}
    features = cpu.get("features") if isinstance(cpu, Mapping) else None
    return tuple(driver_traits(hypervisor_type,
                               [str(f) for f in features] if isinstance(features, list) else []))


def _node_providers(entry: Mapping[str, Any], path: str, record: HostRecord) -> NodeProviders:
    """The node's traits (given, or those its driver reports), extra inventories,
    dedicated CPUs and nested providers."""
    r = FieldReader(entry, path)
    if r.has("traits"):
        traits = read_traits(entry["traits"], r.at("traits"))
    else:
        traits = list(_reported_traits(record.hypervisor_type, record.cpu_info or "{}"))
    pcpus = 0
    if r.has("cpu_dedicated_set"):
        from berth.hardware.numa import parse_cpu_spec

        value = entry["cpu_dedicated_set"]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise CloudFileError(f"{r.at('cpu_dedicated_set')}: expected a CPU set such as "
                                 f"'4-7,^6', got {show(value)}")
        try:
            pcpus = len(parse_cpu_spec(str(value)))
        except ValueError as exc:
            raise CloudFileError(f"{r.at('cpu_dedicated_set')}: {exc}") from None
    return NodeProviders(
        traits=traits, pcpus=pcpus,
        resources=read_resources(entry["resources"], r.at("resources"), host_fields=True)
        if r.has("resources") else {},
        children=read_nested(entry["providers"], r.at("providers")) if r.has("providers") else [])


def _same_service_host(
    record: HostRecord, entry: Mapping[str, Any], path: str, first_path: str, first: HostRecord
) -> None:
    """A further node of a service host (several entries with one ``host``, as an Ironic
    compute service has): one nova-compute service in one cell serves them all, so the
    entry takes the first entry's ``service`` unless it repeats it, and names its cell."""
    if record.cell_uuid != first.cell_uuid:
        raise CloudFileError(
            f"{path}.cell: {entry.get('cell')!r} is not the cell of {first_path}, another node "
            f"of service host {record.host!r} (the nodes of one host are in one cell)")
    if entry.get("service") is not None and record.service != first.service:
        raise CloudFileError(
            f"{path}.service: differs from {first_path}.service of the same service host "
            f"{record.host!r} (one nova-compute service serves all its nodes; give it once)")
    record.service = first.service


def _stamp(entry: dict[str, Any], index: int, path: str) -> dict[str, Any]:
    stamped = dict(entry)
    stamped.pop("count", None)
    stamped.pop("start", None)
    for key in ("host", "nodename", "host_ip", "hypervisor_hostname"):
        value = stamped.get(key)
        if isinstance(value, str):
            try:
                stamped[key] = value.format(index=index)
            except (KeyError, IndexError, ValueError) as exc:
                raise CloudFileError(f"{path}.{key}: bad placeholder in {value!r}: {exc}") from None
    if stamped.get("host") == entry.get("host") and stamped.get("nodename") == entry.get("nodename"):
        raise CloudFileError(f"{path}.host: with count, the host name (or, for the nodes of "
                             f"one service host, nodename) needs an {{index}} placeholder")
    return stamped


def _flavors(top: FieldReader) -> dict[str, Flavor]:
    """The cloud file's flavors. An ``id`` is one flavor's; a flavor without one takes
    its position (1, 2, ...) or, when a given id holds that, the next free one. An entry
    that is exactly one of Berth's defaults, its usual id included (an earlier ``berth
    cloud export`` wrote the defaults out), is that default, not a flavor of the file's."""
    parsed: list[tuple[int, Flavor, bool]] = []  # (position, flavor, id given)
    names: set[str] = set()
    for i, item in enumerate(top.seq("flavors")):
        r = FieldReader(item, f"flavors[{i}]")
        r.unknown({"name", "vcpus", "memory_mb", "ram", "root_gb", "disk", "ephemeral_gb", "swap",
                   "id", "flavorid", "extra_specs"})
        name = r.text("name", required=True)
        assert name is not None
        if name in names:
            raise CloudFileError(f"flavors[{i}].name: duplicate flavor {name!r}")
        names.add(name)
        memory = r.integer("memory_mb", default=r.integer("ram", maximum=MAX_INT), minimum=1,
                           maximum=MAX_INT)
        if memory is None:
            raise CloudFileError(f"flavors[{i}].memory_mb: required field is missing")
        given = r.integer("id")
        flavor = Flavor(
            name=name,
            vcpus=r.integer("vcpus", required=True, minimum=1, maximum=MAX_INT) or 1,
            memory_mb=memory,
            root_gb=r.integer("root_gb", default=r.integer("disk", default=0, maximum=MAX_INT),
                              maximum=MAX_INT) or 0,
            ephemeral_gb=r.integer("ephemeral_gb", default=0, maximum=MAX_INT) or 0,
            swap=r.integer("swap", default=0, maximum=MAX_INT) or 0,
            id=given,
            flavorid=r.text("flavorid") or name,
            extra_specs=r.str_map("extra_specs"),
        )
        if given is not None and same_as_default(flavor):
            continue
        parsed.append((i, flavor, given is not None))
    holders: dict[int, str] = {}
    for i, flavor, given in parsed:
        if given:
            assert isinstance(flavor.id, int)
            if flavor.id in holders:
                raise CloudFileError(f"flavors[{i}].id: {flavor.id} is also flavor "
                                     f"{holders[flavor.id]!r}'s id", field=f"flavors[{i}].id")
            holders[flavor.id] = flavor.name
    taken = set(holders)
    flavors: dict[str, Flavor] = {}
    for i, flavor, given in parsed:
        if not given:
            flavor.id = _free_id(i + 1, taken)
        flavors[flavor.name] = flavor
    return flavors


def _free_id(position: int, taken: set[int]) -> int:
    """``position``, or the first id above it that no flavor holds (now taken)."""
    while position in taken:
        position += 1
    taken.add(position)
    return position


@dataclass
class BrokenImage:
    """An image whose properties do not parse: the first problem, and the properties
    that do parse (what an instance booted from it keeps)."""

    problem: str
    properties: dict[str, Any]


def _parsable(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` without the properties that do not parse."""
    kept = dict(raw)
    while True:
        try:
            ImageMetaProps(kept)
            return kept
        except ImagePropertyError as exc:
            if exc.key not in kept:
                return {}
            kept.pop(exc.key)


def _images(top: FieldReader, broken: dict[str, BrokenImage]) -> dict[str, ImageMeta]:
    images: dict[str, ImageMeta] = {}
    for i, item in enumerate(top.seq("images")):
        r = FieldReader(item, f"images[{i}]")
        r.unknown({"name", "id", "disk_format", "properties"})
        name = r.text("name", required=True)
        assert name is not None
        if name in images:
            raise CloudFileError(f"images[{i}].name: duplicate image {name!r}")
        if name in broken:
            raise CloudFileError(f"images[{i}].name: duplicate image {name!r}")
        raw = r.mapping("properties")
        try:
            properties = ImageMetaProps(raw)
        except ImagePropertyError as exc:
            # Only the requests that use this image fail (naming the field); the rest of
            # the file, instances booted from it included, stays usable.
            broken[name] = BrokenImage(
                f"{r.at('properties')}.{exc.key}: {exc.problem}, got {show(exc.value)}",
                _parsable(raw))
            continue
        images[name] = ImageMeta(id=r.text("id") or stable_uuid("image", name), name=name,
                                 disk_format=r.text("disk_format"), properties=properties)
    return images


def _host(
    entry: dict[str, Any],
    path: str,
    cells: dict[str, CellMapping],
    flavors: dict[str, Flavor],
    images: dict[str, ImageMeta],
    config: SchedulerConfig,
    now: float,
    broken: Mapping[str, BrokenImage],
) -> HostRecord:
    r = FieldReader(entry, path)
    r.unknown(HOST_FIELDS)
    name = r.text("host", required=True)
    assert name is not None
    if not name or name in (".", "..") or "/" in name or not name.isprintable():
        # The services API and `berth compute --host` name a host as one segment of a
        # URL's path; a name that cannot be one could not be reached there.
        raise CloudFileError(f"{r.at('host')}: expected a host name (not empty, '.' or '..', "
                             f"no '/', printable), got {show(name)}")
    nodename = r.text("nodename") or name
    cell_name = r.text("cell")
    cell_uuid = None
    if cell_name is not None:
        if cells and cell_name not in cells:
            raise CloudFileError(f"{r.at('cell')}: no cell named {cell_name!r} in cells")
        cell_uuid = cells[cell_name].uuid if cell_name in cells else stable_uuid("cell", cell_name)

    instances, placed = _instances(r, flavors, images, broken)

    # Nova's compute node columns are INT: so are a host's sizes here.
    vcpus = r.integer("vcpus", default=0, maximum=MAX_INT) or 0
    memory_mb = r.integer("memory_mb", default=0, maximum=MAX_INT) or 0
    local_gb = r.integer("local_gb", default=0, maximum=MAX_INT) or 0
    vcpus_used = r.integer("vcpus_used", default=config.reserved_host_cpus + sum(f.vcpus for f in placed),
                           maximum=MAX_INT)
    memory_used = r.integer("memory_mb_used", default=config.reserved_host_memory_mb + sum(f.memory_mb for f in placed),
                            maximum=MAX_INT)
    disk_used = r.integer("local_gb_used", default=math.ceil(config.reserved_host_disk_mb / 1024)
                      + sum(f.root_gb + f.ephemeral_gb for f in placed), maximum=MAX_INT)
    assert vcpus_used is not None and memory_used is not None and disk_used is not None
    least = r.integer("disk_available_least", default=None, minimum=None)
    free_disk_gb = local_gb - disk_used
    free_disk_mb = (min(free_disk_gb, least) if least is not None else free_disk_gb) * 1024

    stats = r.str_map("stats") if r.has("stats") else {}
    stats.setdefault("num_instances", str(len(instances)))
    if r.has("io_workload"):
        stats["io_workload"] = str(r.integer("io_workload"))
    if r.has("failed_builds"):
        stats["failed_builds"] = str(r.integer("failed_builds"))
    for key in ("num_instances", "io_workload", "failed_builds"):  # the counts read as ints
        value = stats.get(key)
        if value is not None and not str(value).strip().isdigit():
            raise CloudFileError(f"{r.at('stats')}.{key}: expected a count (an integer >= 0), "
                                 f"got {show(value)}")

    cpu_info: Any = entry.get("cpu_info", {})
    if isinstance(cpu_info, Mapping):
        cpu_info = json.dumps(cpu_info, sort_keys=True)
    elif not isinstance(cpu_info, str):
        raise CloudFileError(f"{r.at('cpu_info')}: expected a mapping or JSON text, got {show(cpu_info)}")

    supported = []
    for j, triple in enumerate(r.seq("supported_instances")):
        if not (isinstance(triple, list) and len(triple) == 3 and all(isinstance(x, str) for x in triple)):
            raise CloudFileError(f"{r.at('supported_instances')}[{j}]: expected [arch, hv_type, vm_mode], got {show(triple)}")
        supported.append(list(triple))

    metrics = _metrics(r)
    service = _service(r, name, config, now)
    numa = None
    if r.has("numa_topology"):
        from berth.hardware.numa import NUMATopology

        try:
            numa = NUMATopology.from_dict(r.mapping("numa_topology"))
        except (KeyError, TypeError, ValueError) as exc:
            raise CloudFileError(f"{r.at('numa_topology')}: {exc}") from exc
    pci = None
    if r.has("pci_pools"):
        from berth.hardware.pci import PciDeviceStats

        try:
            pci = PciDeviceStats.from_pools(r.seq("pci_pools"), numa_topology=numa)
        except (KeyError, TypeError, ValueError) as exc:
            raise CloudFileError(f"{r.at('pci_pools')}: {exc}") from exc

    return HostRecord(
        host=name,
        nodename=nodename,
        cell_uuid=cell_uuid,
        uuid=r.uuid("uuid") or stable_uuid("node", name, nodename),
        total_usable_ram_mb=memory_mb,
        free_ram_mb=memory_mb - memory_used,
        total_usable_disk_gb=local_gb,
        disk_mb_used=disk_used * 1024,
        free_disk_mb=free_disk_mb,
        vcpus_total=vcpus,
        vcpus_used=vcpus_used,
        hypervisor_type=r.text("hypervisor_type"),
        hypervisor_version=r.integer("hypervisor_version", default=None),
        hypervisor_hostname=r.text("hypervisor_hostname") or nodename,
        host_ip=r.text("host_ip"),
        cpu_info=cpu_info,
        supported_instances=supported,
        stats=stats,
        metrics=metrics,
        numa_topology=numa,
        pci_stats=pci,
        cpu_allocation_ratio=_ratio(r, "cpu", config),
        ram_allocation_ratio=_ratio(r, "ram", config),
        disk_allocation_ratio=_ratio(r, "disk", config),
        service=service,
        instances=instances,
        updated=now,
    )


def _ratio(r: FieldReader, kind: str, config: SchedulerConfig) -> float:
    """A node's allocation ratio, resolved as ComputeNode does (reference §10.3)."""
    value = r.number(f"{kind}_allocation_ratio")
    if value is not None and value > MAX_FLOAT:  # Placement's bound of a ratio
        raise CloudFileError(f"{r.at(f'{kind}_allocation_ratio')}: expected a number up to "
                             f"{MAX_FLOAT:g}, got {value:g}")
    if value:
        return value
    configured = getattr(config, f"{kind}_allocation_ratio")
    if configured:
        return float(configured)
    return float(getattr(config, f"initial_{kind}_allocation_ratio"))


def _instances(
    r: FieldReader, flavors: dict[str, Flavor], images: dict[str, ImageMeta],
    broken: Mapping[str, BrokenImage],
) -> tuple[dict[str, Instance], list[Flavor]]:
    """The host's instances, and the flavors of those that name one (for usage)."""
    result: dict[str, Instance] = {}
    placed: list[Flavor] = []
    for j, item in enumerate(r.seq("instances")):
        path = f"{r.at('instances')}[{j}]"
        if isinstance(item, str):
            item = {"uuid": item}
        ir = FieldReader(item, path)
        ir.unknown({"uuid", "flavor", "image", "project_id"})
        uuid = ir.text("uuid", required=True)
        assert uuid is not None
        flavor_name = ir.text("flavor")
        flavor = None
        if flavor_name is not None:
            if flavor_name not in flavors:
                raise CloudFileError(f"{path}.flavor: no flavor named {flavor_name!r} in "
                                     f"flavors or Berth's defaults ({', '.join(DEFAULT_FLAVORS)})")
            flavor = flavors[flavor_name]
            placed.append(flavor)
        image_name = ir.text("image")
        properties: dict[str, Any] = {}
        if image_name is not None and image_name in broken:
            # Booted before the image's properties went bad: it keeps the good ones.
            properties = dict(broken[image_name].properties)
        elif image_name is not None:
            if image_name not in images:
                raise CloudFileError(f"{path}.image: no image named {image_name!r} in images")
            # As given (Nova keeps an instance's image properties as text): JSON-safe,
            # and typed again the same way wherever they are read.
            properties = dict(images[image_name].properties.raw)
        result[uuid] = Instance(uuid=uuid, instance_type_id=flavor.id if flavor else None,
                                image_properties=properties, project_id=ir.text("project_id"))
    return result, placed


def _metrics(r: FieldReader) -> list[MetricItem]:
    raw = r.data.get("metrics")
    if raw is None:
        return []
    items: list[MetricItem] = []
    if isinstance(raw, Mapping):
        for name, value in raw.items():
            items.append(MetricItem(str(name), _metric_value(value, f"{r.at('metrics')}.{name}")))
    elif isinstance(raw, list):
        for j, item in enumerate(raw):
            mr = FieldReader(item, f"{r.at('metrics')}[{j}]")
            mr.unknown({"name", "value", "timestamp", "source"})
            name = mr.text("name", required=True)
            assert name is not None
            items.append(MetricItem(name, _metric_value(mr.data.get("value"), mr.at("value")),
                                    source=mr.text("source")))
    else:
        raise CloudFileError(f"{r.at('metrics')}: expected a mapping name: value, got {show(raw)}")
    return items


def _metric_value(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CloudFileError(f"{path}: expected a number, got {show(value)}")
    return float(value)


def _service(r: FieldReader, host: str, config: SchedulerConfig, now: float) -> ServiceRecord:
    s = FieldReader(r.mapping("service"), r.at("service"))
    s.unknown({"disabled", "disabled_reason", "forced_down", "up", "last_seen_up", "created_at"})
    if s.has("last_seen_up"):
        last_seen = timestamp(s.data["last_seen_up"], s.at("last_seen_up"))
    elif s.flag("up", default=True):
        last_seen = now
    else:
        # A host said to be down last reported long before the down time.
        last_seen = now - 10 * max(config.service_down_time, config.report_interval * 3)
    created = timestamp(s.data["created_at"], s.at("created_at")) if s.has("created_at") else None
    return ServiceRecord(host=host, disabled=s.flag("disabled"), disabled_reason=s.text("disabled_reason"),
                         forced_down=s.flag("forced_down"), last_seen_up=last_seen, created_at=created)


def _groups(top: FieldReader, records: list[HostRecord]) -> dict[str, InstanceGroup]:
    where: dict[str, str] = {}
    for record in records:
        for uuid in record.instances:
            where[uuid] = record.host
    groups: dict[str, InstanceGroup] = {}
    for i, item in enumerate(top.seq("server_groups")):
        r = FieldReader(item, f"server_groups[{i}]")
        r.unknown({"name", "policy", "rules", "members", "project_id", "uuid"})
        name = r.text("name", required=True)
        policy = r.text("policy", required=True)
        assert name is not None and policy is not None
        if policy not in InstanceGroup.VALID_POLICIES:
            raise CloudFileError(f"server_groups[{i}].policy: expected one of "
                                 f"{', '.join(InstanceGroup.VALID_POLICIES)}, got {policy!r}")
        rules = r.mapping("rules")
        if set(rules) - {"max_server_per_host"}:
            raise CloudFileError(f"server_groups[{i}].rules: only max_server_per_host is supported, got {sorted(rules)}")
        if "max_server_per_host" in rules:
            value = rules["max_server_per_host"]
            if isinstance(value, bool) or not str(value).isdigit() or int(value) < 1:
                raise CloudFileError(f"server_groups[{i}].rules.max_server_per_host: expected an integer >= 1, got {show(value)}")
        members = [str(m) for m in r.seq("members")]
        for j, member in enumerate(members):
            if member not in where:
                raise CloudFileError(f"server_groups[{i}].members[{j}]: no instance {member!r} on any host")
        hosts = sorted({where[m] for m in members})
        groups[name] = InstanceGroup(policy=policy, uuid=r.text("uuid") or stable_uuid("group", name),
                                     name=name, rules=rules, members=members, hosts=hosts,
                                     project_id=r.text("project_id"))
    return groups
