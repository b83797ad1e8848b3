"""Nova's versioned-object primitives, both ways, without Nova's code.

Every Nova object travels as ``{"nova_object.name", "nova_object.namespace": "nova",
"nova_object.version", "nova_object.data": {field: primitive}, "nova_object.changes"}``
(reference ``nova-scheduler-rpc.md`` §1.3). This module reads what a nova-conductor
sends to its scheduler and writes what it expects back:

* :func:`request_spec_from_primitive`: a RequestSpec (1.15; older minors read the same:
  a field may be missing, unknown fields are ignored) with its flavor, image and image
  properties, server group, destination, retries, NUMA topology, PCI requests, request
  groups and request-level parameters, network metadata, and requested networks, as
  Berth's :class:`~berth.model.request.RequestSpec`;
* :func:`request_spec_from_legacy`: the 4.0 form (``request_spec`` and
  ``filter_properties`` dicts, as an old conductor sends them);
* :func:`selection_primitive` (Selection 1.1 with SchedulerLimits 1.0 and
  NUMATopologyLimits 1.1) and :func:`legacy_selection` (``return_objects=False``);
* :func:`aggregate_from_primitive` and :func:`instance_uuids_of` for the casts that
  keep the host state current.

A primitive that does not read as the object it claims to be raises
:class:`PrimitiveError` naming the object and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from berth.errors import InputError
from berth.hardware.numa import InstanceNUMACell, InstanceNUMATopology, NUMATopologyLimits
from berth.hardware.pci import InstancePCIRequest, InstancePCIRequests
from berth.model.aggregate import Aggregate
from berth.model.compute import Instance
from berth.model.request import (
    CellMapping,
    ComputeNodeRef,
    Destination,
    Flavor,
    ImageMeta,
    ImageMetaProps,
    InstanceGroup,
    NetworkMetadata,
    RequestSpec,
    SchedulerRetries,
)
from berth.model.selection import Selection, scheduler_limits
from berth.resource_request import RequestGroup, RequestLevelParams

NAME, NAMESPACE, VERSION, DATA, CHANGES = (
    "nova_object.name", "nova_object.namespace", "nova_object.version", "nova_object.data",
    "nova_object.changes")

#: The versions Berth writes.
SELECTION_VERSION = "1.1"
SCHEDULER_LIMITS_VERSION = "1.0"
NUMA_LIMITS_VERSION = "1.1"
NETWORK_METADATA_VERSION = "1.0"


class PrimitiveError(InputError):
    """A primitive that is not the object it should be."""

    code = "berth.nova.primitive"


# ----------------------------------------------------------------------------- reading
def is_primitive(value: Any) -> bool:
    """True for a versioned-object primitive."""
    return isinstance(value, Mapping) and NAME in value and DATA in value


def data_of(value: Any, name: str | tuple[str, ...], where: str) -> dict[str, Any]:
    """The ``nova_object.data`` of a primitive of object ``name`` (or one of several)."""
    names = (name,) if isinstance(name, str) else name
    if not is_primitive(value):
        raise PrimitiveError(f"{where}: expected a {names[0]} primitive, got "
                             f"{type(value).__name__}", field=where)
    if value[NAME] not in names:
        raise PrimitiveError(f"{where}: expected a {' or '.join(names)} primitive, got a "
                             f"{value[NAME]}", field=where)
    data = value[DATA]
    if not isinstance(data, Mapping):
        raise PrimitiveError(f"{where}: nova_object.data is not an object", field=where)
    return dict(data)


def objects_of(value: Any, list_name: str, item: str, where: str) -> list[dict[str, Any]]:
    """The items' data of a ``*List`` primitive (``{"objects": [...]}``) or a plain list."""
    if value is None:
        return []
    items = value if isinstance(value, list) else data_of(value, list_name, where).get(
        "objects") or []
    return [data_of(o, item, f"{where}[{i}]") for i, o in enumerate(items)]


def _opt(data: Mapping[str, Any], key: str, default: Any = None) -> Any:
    value = data.get(key, default)
    return default if value is None else value


def _strings(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, (list, tuple, set)) or not all(isinstance(v, str) for v in value):
        raise PrimitiveError(f"{where}: expected a list of strings, got {value!r}", field=where)
    return list(value)


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool):
        raise PrimitiveError(f"{where}: expected an integer, got {value!r}", field=where)
    try:
        return int(value)
    except (TypeError, ValueError):
        raise PrimitiveError(f"{where}: expected an integer, got {value!r}", field=where) from None


#: The most instances one request may ask for: Nova sets no bound but its quotas, and a
#: request for 2**31 - 1 grew a scheduler by gigabytes while it held the lock every
#: other request waits for.
MAX_NUM_INSTANCES = 10_000


def _count(value: Any, where: str) -> int:
    """``num_instances``: at least 1 (Nova's field default), at most
    :data:`MAX_NUM_INSTANCES`."""
    count = _int(value, where)
    if count > MAX_NUM_INSTANCES:
        raise PrimitiveError(f"{where}: at most {MAX_NUM_INSTANCES} instances in one request, "
                             f"got {count}", field=where)
    return max(1, count)


def instances_asked(spec_obj: Any, request_spec: Any) -> int:
    """The ``num_instances`` a request spec (a RequestSpec primitive, else the legacy
    dict) asks for, as given; 1 when it cannot be read (the spec's own reading then says
    what is wrong)."""
    try:
        if spec_obj is not None:
            value = data_of(spec_obj, "RequestSpec", "spec_obj").get("num_instances", 1)
        else:
            value = (request_spec or {}).get("num_instances", 1)
        return _int(value, "num_instances")
    except (PrimitiveError, AttributeError):
        return 1


def flavor_from_primitive(value: Any, where: str = "flavor") -> Flavor:
    """A Flavor (1.x)."""
    d = data_of(value, "Flavor", where)
    specs = _opt(d, "extra_specs", {})
    if not isinstance(specs, Mapping):
        raise PrimitiveError(f"{where}.extra_specs: expected an object", field=where)
    return Flavor(name=str(_opt(d, "name", "")), vcpus=_int(_opt(d, "vcpus", 0), f"{where}.vcpus"),
                  memory_mb=_int(_opt(d, "memory_mb", 0), f"{where}.memory_mb"),
                  root_gb=_int(_opt(d, "root_gb", 0), f"{where}.root_gb"),
                  ephemeral_gb=_int(_opt(d, "ephemeral_gb", 0), f"{where}.ephemeral_gb"),
                  swap=_int(_opt(d, "swap", 0), f"{where}.swap"), id=d.get("id"),
                  flavorid=d.get("flavorid"),
                  extra_specs={str(k): str(v) for k, v in specs.items()})


def image_from_primitive(value: Any, where: str = "image") -> ImageMeta | None:
    """An ImageMeta (1.x) with its ImageMetaProps; None for none."""
    if value is None:
        return None
    d = data_of(value, "ImageMeta", where)
    props: dict[str, Any] = {}
    raw = d.get("properties")
    if raw is not None:
        props = data_of(raw, "ImageMetaProps", f"{where}.properties")
    # The object's list of required traits is the image's ``trait:NAME=required`` keys.
    traits = props.pop("traits_required", None) or []
    for trait in _strings(traits, f"{where}.properties.traits_required"):
        props[f"trait:{trait}"] = "required"
    return ImageMeta(id=d.get("id"), name=d.get("name"), disk_format=d.get("disk_format"),
                     properties=ImageMetaProps(props))


def instance_group_from_primitive(value: Any, where: str = "instance_group") -> InstanceGroup | None:
    """An InstanceGroup (1.10 policies list, 1.11+ policy and rules)."""
    if value is None:
        return None
    d = data_of(value, "InstanceGroup", where)
    policy = d.get("policy")
    if policy is None:
        policies = _strings(d.get("policies"), f"{where}.policies")
        policy = policies[0] if policies else None
    if policy not in InstanceGroup.VALID_POLICIES:
        raise PrimitiveError(f"{where}.policy: expected one of "
                             f"{', '.join(InstanceGroup.VALID_POLICIES)}, got {policy!r}",
                             field=where)
    # The object keeps its rules in ``_rules`` (string values); older minors in ``rules``.
    rules = _opt(d, "_rules", None) or _opt(d, "rules", {})
    if not isinstance(rules, Mapping):
        raise PrimitiveError(f"{where}.rules: expected an object", field=where)
    return InstanceGroup(policy=policy, uuid=str(_opt(d, "uuid", "")), name=str(_opt(d, "name", "")),
                         rules=dict(rules), members=_strings(d.get("members"), f"{where}.members"),
                         hosts=_strings(d.get("hosts"), f"{where}.hosts"),
                         project_id=d.get("project_id"), user_id=d.get("user_id"))


def cell_from_primitive(value: Any, where: str) -> CellMapping | None:
    """A CellMapping."""
    if value is None:
        return None
    d = data_of(value, "CellMapping", where)
    return CellMapping(uuid=str(_opt(d, "uuid", "")), name=str(_opt(d, "name", "")),
                       disabled=bool(_opt(d, "disabled", False)))


def destination_from_primitive(value: Any, where: str = "requested_destination") -> Destination | None:
    """A Destination (1.x)."""
    if value is None:
        return None
    d = data_of(value, "Destination", where)
    return Destination(host=d.get("host"), node=d.get("node"),
                       cell=cell_from_primitive(d.get("cell"), f"{where}.cell"),
                       aggregates=_strings(d.get("aggregates"), f"{where}.aggregates"),
                       forbidden_aggregates=set(_strings(d.get("forbidden_aggregates"),
                                                         f"{where}.forbidden_aggregates")),
                       allow_cross_cell_move=bool(_opt(d, "allow_cross_cell_move", False)))


def retry_from_primitive(value: Any, where: str = "retry") -> SchedulerRetries | None:
    """SchedulerRetries with the compute nodes tried."""
    if value is None:
        return None
    d = data_of(value, "SchedulerRetries", where)
    nodes = objects_of(d.get("hosts"), "ComputeNodeList", "ComputeNode", f"{where}.hosts")
    return SchedulerRetries(num_attempts=_int(_opt(d, "num_attempts", 0), f"{where}.num_attempts"),
                            hosts=[ComputeNodeRef(str(n.get("host")),
                                                  str(n.get("hypervisor_hostname")))
                                   for n in nodes])


def numa_from_primitive(value: Any, where: str = "numa_topology") -> InstanceNUMATopology | None:
    """An InstanceNUMATopology with its InstanceNUMACells."""
    if value is None:
        return None
    d = data_of(value, "InstanceNUMATopology", where)
    cells = []
    for i, c in enumerate(objects_of(d.get("cells"), "InstanceNUMACellList", "InstanceNUMACell",
                                     f"{where}.cells")):
        at = f"{where}.cells[{i}]"
        pinning = c.get("cpu_pinning_raw") or {}
        reserved = c.get("cpuset_reserved")
        cells.append(InstanceNUMACell(
            id=_int(_opt(c, "id", i), f"{at}.id"),
            cpuset={_int(v, f"{at}.cpuset") for v in _opt(c, "cpuset", [])},
            pcpuset={_int(v, f"{at}.pcpuset") for v in _opt(c, "pcpuset", [])},
            memory=_int(_opt(c, "memory", 0), f"{at}.memory"), pagesize=c.get("pagesize"),
            cpu_policy=c.get("cpu_policy"), cpu_thread_policy=c.get("cpu_thread_policy"),
            cpu_pinning={_int(k, f"{at}.cpu_pinning_raw"): _int(v, f"{at}.cpu_pinning_raw")
                         for k, v in pinning.items()},
            cpuset_reserved=None if reserved is None else {_int(v, f"{at}.cpuset_reserved")
                                                           for v in reserved}))
    return InstanceNUMATopology(cells=cells,
                                emulator_threads_policy=d.get("emulator_threads_policy"))


def pci_requests_from_primitive(value: Any, where: str = "pci_requests") -> InstancePCIRequests | None:
    """InstancePCIRequests (or a plain list of InstancePCIRequest)."""
    if value is None:
        return None
    if isinstance(value, list):
        items = [data_of(v, "InstancePCIRequest", f"{where}[{i}]") for i, v in enumerate(value)]
    else:
        items = objects_of(data_of(value, "InstancePCIRequests", where).get("requests") or [],
                           "", "InstancePCIRequest", f"{where}.requests")
    requests = []
    for i, r in enumerate(items):
        spec = r.get("spec") or []
        if not isinstance(spec, list) or not all(isinstance(s, Mapping) for s in spec):
            raise PrimitiveError(f"{where}.requests[{i}].spec: expected a list of objects",
                                 field=where)
        requests.append(InstancePCIRequest(
            count=_int(_opt(r, "count", 1), f"{where}.requests[{i}].count"),
            spec=[dict(s) for s in spec], alias_name=r.get("alias_name"),
            numa_policy=r.get("numa_policy"), request_id=r.get("request_id")))
    return InstancePCIRequests(requests=requests)


def request_group_from_primitive(value: Any, where: str) -> RequestGroup:
    """A RequestGroup (1.x)."""
    d = data_of(value, "RequestGroup", where)
    aggregates = d.get("aggregates") or []
    if not isinstance(aggregates, list) or not all(isinstance(a, list) for a in aggregates):
        raise PrimitiveError(f"{where}.aggregates: expected a list of lists", field=where)
    resources = _opt(d, "resources", {})
    return RequestGroup(
        requester_id=str(_opt(d, "requester_id", "")),
        use_same_provider=bool(_opt(d, "use_same_provider", True)),
        resources={str(k): _int(v, f"{where}.resources.{k}") for k, v in resources.items()},
        required_traits=set(_strings(d.get("required_traits"), f"{where}.required_traits")),
        forbidden_traits=set(_strings(d.get("forbidden_traits"), f"{where}.forbidden_traits")),
        aggregates=[list(a) for a in aggregates],
        forbidden_aggregates=set(_strings(d.get("forbidden_aggregates"),
                                          f"{where}.forbidden_aggregates")),
        in_tree=d.get("in_tree"),
        provider_uuids=_strings(d.get("provider_uuids"), f"{where}.provider_uuids"))


def level_params_from_primitive(value: Any, where: str = "request_level_params") -> RequestLevelParams | None:
    """RequestLevelParams (root traits, same_subtree)."""
    if value is None:
        return None
    d = data_of(value, "RequestLevelParams", where)
    same = d.get("same_subtree") or []
    return RequestLevelParams(
        root_required=set(_strings(d.get("root_required"), f"{where}.root_required")),
        root_forbidden=set(_strings(d.get("root_forbidden"), f"{where}.root_forbidden")),
        same_subtree=[_strings(s, f"{where}.same_subtree") for s in same])


def network_metadata_from_primitive(value: Any, where: str = "network_metadata") -> NetworkMetadata | None:
    """NetworkMetadata (physnets, tunneled)."""
    if value is None:
        return None
    d = data_of(value, "NetworkMetadata", where)
    return NetworkMetadata(physnets=set(_strings(d.get("physnets"), f"{where}.physnets")),
                           tunneled=bool(_opt(d, "tunneled", False)))


def requested_networks_from_primitive(value: Any, where: str = "requested_networks") -> list[dict[str, Any]] | None:
    """A NetworkRequestList as plain dicts (network_id, port_id, ...)."""
    if value is None:
        return None
    return objects_of(value, "NetworkRequestList", "NetworkRequest", where)


def _hints(value: Any, where: str) -> dict[str, list[str]] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PrimitiveError(f"{where}: expected an object of lists", field=where)
    return {str(k): [str(x) for x in (v if isinstance(v, list) else [v])]
            for k, v in value.items()}


def _optional_strings(value: Any, where: str) -> list[str] | None:
    return None if value is None else _strings(value, where)


def request_spec_from_primitive(value: Any) -> RequestSpec:
    """A RequestSpec primitive (see the module's docstring) as Berth's request."""
    d = data_of(value, "RequestSpec", "spec_obj")
    if d.get("flavor") is None:
        raise PrimitiveError("spec_obj.flavor: missing", field="spec_obj.flavor")
    groups = [request_group_from_primitive(g, f"spec_obj.requested_resources[{i}]")
              for i, g in enumerate(d.get("requested_resources") or [])]
    return RequestSpec(
        flavor=flavor_from_primitive(d["flavor"], "spec_obj.flavor"),
        image=image_from_primitive(d.get("image"), "spec_obj.image"),
        scheduler_hints=_hints(d.get("scheduler_hints"), "spec_obj.scheduler_hints"),
        instance_group=instance_group_from_primitive(d.get("instance_group"),
                                                     "spec_obj.instance_group"),
        project_id=d.get("project_id"), user_id=d.get("user_id"),
        availability_zone=d.get("availability_zone"),
        num_instances=_count(_opt(d, "num_instances", 1), "spec_obj.num_instances"),
        instance_uuid=d.get("instance_uuid"),
        ignore_hosts=_optional_strings(d.get("ignore_hosts"), "spec_obj.ignore_hosts"),
        force_hosts=_optional_strings(d.get("force_hosts"), "spec_obj.force_hosts"),
        force_nodes=_optional_strings(d.get("force_nodes"), "spec_obj.force_nodes"),
        requested_destination=destination_from_primitive(d.get("requested_destination"),
                                                         "spec_obj.requested_destination"),
        retry=retry_from_primitive(d.get("retry"), "spec_obj.retry"),
        numa_topology=numa_from_primitive(d.get("numa_topology"), "spec_obj.numa_topology"),
        pci_requests=pci_requests_from_primitive(d.get("pci_requests"), "spec_obj.pci_requests")
        or InstancePCIRequests(),
        network_metadata=network_metadata_from_primitive(d.get("network_metadata"),
                                                         "spec_obj.network_metadata"),
        requested_resources=groups,
        request_level_params=level_params_from_primitive(d.get("request_level_params"),
                                                         "spec_obj.request_level_params")
        or RequestLevelParams(),
        is_bfv=bool(_opt(d, "is_bfv", False)),
        requested_networks=requested_networks_from_primitive(d.get("requested_networks")))


def _legacy_flavor(value: Any, where: str) -> Flavor:
    if is_primitive(value):
        return flavor_from_primitive(value, where)
    if not isinstance(value, Mapping):
        raise PrimitiveError(f"{where}: expected a flavor", field=where)
    return flavor_from_primitive({NAME: "Flavor", DATA: dict(value)}, where)


def request_spec_from_legacy(request_spec: Any, filter_properties: Any) -> RequestSpec:
    """The 4.0 form: Nova's legacy ``request_spec`` dict (``instance_type``, ``image``,
    ``instance_properties``, ``num_instances``) and ``filter_properties`` dict
    (``scheduler_hints``, ``force_hosts``, ``force_nodes``, ``ignore_hosts``, ``retry``,
    the ``group_*`` keys, ``pci_requests``)."""
    if not isinstance(request_spec, Mapping):
        raise PrimitiveError("request_spec: expected an object", field="request_spec")
    props = filter_properties if isinstance(filter_properties, Mapping) else {}
    flavor_value = request_spec.get("instance_type") or props.get("instance_type")
    if flavor_value is None:
        raise PrimitiveError("request_spec.instance_type: missing", field="request_spec")
    instance = request_spec.get("instance_properties") or {}
    image_value = request_spec.get("image") or {}
    image = None
    if isinstance(image_value, Mapping) and image_value:
        if is_primitive(image_value):
            image = image_from_primitive(image_value, "request_spec.image")
        else:
            image = ImageMeta(id=image_value.get("id"), name=image_value.get("name"),
                              disk_format=image_value.get("disk_format"),
                              properties=ImageMetaProps(image_value.get("properties") or {}))
    group = None
    policies = props.get("group_policies")
    if policies:
        policy = sorted(policies)[0] if isinstance(policies, (list, set, tuple)) else policies
        group = InstanceGroup(policy=str(policy),
                              members=_strings(props.get("group_members"), "group_members"),
                              hosts=_strings(props.get("group_hosts"), "group_hosts"))
    retry = props.get("retry")
    retries = None
    if isinstance(retry, Mapping):
        retries = SchedulerRetries(
            num_attempts=_int(retry.get("num_attempts", 0), "retry.num_attempts"),
            hosts=[ComputeNodeRef(str(h[0]), str(h[1])) for h in retry.get("hosts") or []])
    numa = instance.get("numa_topology")
    pci = props.get("pci_requests") or instance.get("pci_requests")
    return RequestSpec(
        flavor=_legacy_flavor(flavor_value, "request_spec.instance_type"), image=image,
        scheduler_hints=_hints(props.get("scheduler_hints"), "filter_properties.scheduler_hints"),
        instance_group=group, project_id=instance.get("project_id"),
        user_id=instance.get("user_id"), availability_zone=instance.get("availability_zone"),
        num_instances=_count(request_spec.get("num_instances", 1), "num_instances"),
        instance_uuid=instance.get("uuid"),
        ignore_hosts=_optional_strings(props.get("ignore_hosts"), "ignore_hosts"),
        force_hosts=_optional_strings(props.get("force_hosts"), "force_hosts"),
        force_nodes=_optional_strings(props.get("force_nodes"), "force_nodes"),
        retry=retries,
        numa_topology=numa_from_primitive(numa) if is_primitive(numa) else None,
        pci_requests=pci_requests_from_primitive(pci) if pci else InstancePCIRequests())


def aggregate_from_primitive(value: Any, where: str = "aggregate") -> Aggregate:
    """An Aggregate (id, uuid, name, hosts, metadata)."""
    d = data_of(value, "Aggregate", where)
    metadata = _opt(d, "metadata", {})
    return Aggregate(id=_int(_opt(d, "id", 0), f"{where}.id"), name=str(_opt(d, "name", "")),
                     hosts=tuple(_strings(d.get("hosts"), f"{where}.hosts")),
                     metadata={str(k): str(v) for k, v in metadata.items()},
                     uuid=str(_opt(d, "uuid", "")))


def instance_uuids_of(value: Any, where: str = "instance_info") -> list[str]:
    """The uuids of an Instance or InstanceList primitive."""
    return [i.uuid for i in instances_of(value, where)]


def instances_of(value: Any, where: str = "instance_info") -> list[Instance]:
    """The instances of an Instance or InstanceList primitive, as a host state holds
    them (uuid, flavor id, project; the latter two None when the object left them out)."""
    if is_primitive(value) and value[NAME] == "InstanceList":
        items = [dict(o) for o in objects_of(value, "InstanceList", "Instance", where)]
    else:
        items = [dict(data_of(value, "Instance", where))]
    out = []
    for d in items:
        type_id = d.get("instance_type_id")
        out.append(Instance(uuid=str(d.get("uuid")),
                            instance_type_id=int(type_id) if isinstance(type_id, int) else None,
                            project_id=str(d["project_id"]) if d.get("project_id") else None))
    return out


# ----------------------------------------------------------------------------- writing
def primitive(name: str, version: str, data: Mapping[str, Any],
              changes: Iterable[str] | None = None) -> dict[str, Any]:
    """A versioned-object primitive."""
    out: dict[str, Any] = {NAME: name, NAMESPACE: "nova", VERSION: version, DATA: dict(data)}
    if changes is not None:
        out[CHANGES] = list(changes)
    return out


def numa_limits_primitive(limits: Any) -> dict[str, Any]:
    """NUMATopologyLimits 1.1 (with its NetworkMetadata)."""
    data: dict[str, Any] = {"cpu_allocation_ratio": limits.cpu_allocation_ratio,
                            "ram_allocation_ratio": limits.ram_allocation_ratio}
    meta = getattr(limits, "network_metadata", None)
    if meta is not None:
        data["network_metadata"] = primitive("NetworkMetadata", NETWORK_METADATA_VERSION, {
            "physnets": sorted(meta.physnets), "tunneled": bool(meta.tunneled)})
    return primitive("NUMATopologyLimits", NUMA_LIMITS_VERSION, data, data)


def limits_primitive(limits: Mapping[str, Any]) -> dict[str, Any]:
    """SchedulerLimits 1.0: every field present (null when unset), as Nova's conductor
    reads it back."""
    kept = scheduler_limits(limits)
    numa = kept.get("numa_topology")
    data = {"numa_topology": numa_limits_primitive(numa) if isinstance(numa, NUMATopologyLimits)
            else None,
            "vcpu": kept.get("vcpu"), "disk_gb": kept.get("disk_gb"),
            "memory_mb": kept.get("memory_mb")}
    return primitive("SchedulerLimits", SCHEDULER_LIMITS_VERSION, data, data)


def selection_primitive(selection: Selection) -> dict[str, Any]:
    """Selection 1.1; ``allocation_request`` stays the JSON text it is."""
    data = {"compute_node_uuid": selection.compute_node_uuid,
            "service_host": selection.service_host, "nodename": selection.nodename,
            "cell_uuid": selection.cell_uuid, "limits": limits_primitive(selection.limits),
            "allocation_request": selection.allocation_request,
            "allocation_request_version": selection.allocation_request_version,
            "availability_zone": selection.availability_zone}
    return primitive("Selection", SELECTION_VERSION, data, data)


def legacy_selection(selection: Selection) -> dict[str, Any]:
    """``return_objects=False``: the chosen host as Nova's legacy dict (host, nodename,
    the set limits; a NUMA limit as its primitive)."""
    limits = scheduler_limits(selection.limits)
    numa = limits.get("numa_topology")
    if isinstance(numa, NUMATopologyLimits):
        limits["numa_topology"] = numa_limits_primitive(numa)
    return {"host": selection.service_host, "nodename": selection.nodename, "limits": limits}


def allocation_request_of(selection: Selection) -> dict[str, Any] | None:
    """The allocation request a selection carries, decoded."""
    value = json.loads(selection.allocation_request)
    return value if isinstance(value, dict) else None
