"""What Placement knows of a compute node beyond its size: traits, extra inventories,
dedicated CPUs, nested providers; and the sharing providers beside the nodes.

A cloud file describes these per host (``traits``, ``resources``,
``cpu_dedicated_set``, ``providers``) and at the top (``sharing_providers``); the
compute agents of ``berth serve`` and of offline scheduling publish them. The formats
are the ones ``berth cloud import`` writes (docs/cloud-file.md):

* an inventory is ``{total, reserved?, min_unit?, max_unit?, step_size?,
  allocation_ratio?}`` (Placement's defaults: 0, 1, ``total``, 1, 1.0), or just the total;
* a nested provider is ``{name, parent?, resources?, traits?}``; ``parent`` names
  another entry of the same host (none: the node's root provider), and the provider is
  registered as ``<nodename>_<name>``, the way Nova names the children it makes;
* a sharing provider is ``{name, uuid?, resources, traits?, aggregates: [names]}`` and
  carries ``MISC_SHARES_VIA_AGGREGATE``.

A host that lists no ``traits`` gets the ones its virt driver would report
(:func:`driver_traits`): the ``HW_CPU_X86_*`` traits of its ``cpu_info`` features and,
for the libvirt driver (QEMU/KVM), its capability traits. A host that lists them gets
exactly those, as Placement holds them (what an import writes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from berth.errors import CloudFileError
from berth.placement.bounds import MAX_FLOAT as MAX_RATIO
from berth.placement.bounds import MAX_INT

#: The classes a host entry gives with its own fields (``vcpus``, ``memory_mb``,
#: ``local_gb``, ``cpu_dedicated_set``), never under ``resources``.
HOST_FIELD_CLASSES = {"VCPU": "vcpus", "MEMORY_MB": "memory_mb", "DISK_GB": "local_gb",
                      "PCPU": "cpu_dedicated_set"}
SHARING_TRAIT = "MISC_SHARES_VIA_AGGREGATE"
_CUSTOM = re.compile(r"^CUSTOM_[A-Z0-9_]+$")
_INVENTORY_FIELDS = ("total", "reserved", "min_unit", "max_unit", "step_size",
                     "allocation_ratio")

#: The capability traits Nova's libvirt driver reports for a QEMU/KVM host with a
#: current libvirt and QEMU (``LibvirtDriver.capabilities`` and its static traits:
#: image types, storage buses, video and VIF models, vIOMMU models, attach and tag
#: support), plus ``COMPUTE_NODE``, which Nova's resource tracker puts on every compute
#: node's root provider. Traits this installation's os-traits does not know are dropped.
LIBVIRT_CAPABILITY_TRAITS = (
    "COMPUTE_NODE", "COMPUTE_ACCELERATORS", "COMPUTE_DEVICE_TAGGING",
    "COMPUTE_NET_ATTACH_INTERFACE", "COMPUTE_NET_ATTACH_INTERFACE_WITH_TAG",
    "COMPUTE_VOLUME_ATTACH_WITH_TAG", "COMPUTE_VOLUME_EXTEND", "COMPUTE_VOLUME_MULTI_ATTACH",
    "COMPUTE_TRUSTED_CERTS", "COMPUTE_RESCUE_BFV", "COMPUTE_SOCKET_PCI_NUMA_AFFINITY",
    "COMPUTE_ADDRESS_SPACE_EMULATED", "COMPUTE_ADDRESS_SPACE_PASSTHROUGH",
    "COMPUTE_IMAGE_TYPE_AKI", "COMPUTE_IMAGE_TYPE_AMI", "COMPUTE_IMAGE_TYPE_ARI",
    "COMPUTE_IMAGE_TYPE_ISO", "COMPUTE_IMAGE_TYPE_QCOW2", "COMPUTE_IMAGE_TYPE_RAW",
    "COMPUTE_STORAGE_BUS_FDC", "COMPUTE_STORAGE_BUS_IDE", "COMPUTE_STORAGE_BUS_SATA",
    "COMPUTE_STORAGE_BUS_SCSI", "COMPUTE_STORAGE_BUS_USB", "COMPUTE_STORAGE_BUS_VIRTIO",
    "COMPUTE_GRAPHICS_MODEL_BOCHS", "COMPUTE_GRAPHICS_MODEL_CIRRUS",
    "COMPUTE_GRAPHICS_MODEL_NONE", "COMPUTE_GRAPHICS_MODEL_VGA",
    "COMPUTE_GRAPHICS_MODEL_VIRTIO",
    "COMPUTE_NET_VIF_MODEL_E1000", "COMPUTE_NET_VIF_MODEL_E1000E",
    "COMPUTE_NET_VIF_MODEL_NE2K_PCI", "COMPUTE_NET_VIF_MODEL_PCNET",
    "COMPUTE_NET_VIF_MODEL_RTL8139", "COMPUTE_NET_VIF_MODEL_VIRTIO",
    "COMPUTE_NET_VIF_MODEL_VMXNET3",
    "COMPUTE_VIOMMU_MODEL_AUTO", "COMPUTE_VIOMMU_MODEL_INTEL",
    "COMPUTE_VIOMMU_MODEL_VIRTIO",
)  # fmt: skip
#: Hypervisor types served by the libvirt driver.
LIBVIRT_HYPERVISORS = frozenset({"QEMU", "KVM"})


@dataclass
class ProviderSpec:
    """One resource provider below a compute node, or a sharing provider."""

    name: str
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    traits: list[str] = field(default_factory=list)
    #: The name of the parent entry (nested providers); None under the root.
    parent: str | None = None
    uuid: str | None = None
    #: Host aggregates (by name) a sharing provider lends its resources to.
    aggregates: list[str] = field(default_factory=list)


@dataclass
class NodeProviders:
    """What Placement holds for one compute node beyond VCPU, MEMORY_MB and DISK_GB."""

    traits: list[str] = field(default_factory=list)
    resources: dict[str, dict[str, Any]] = field(default_factory=dict)
    pcpus: int = 0
    children: list[ProviderSpec] = field(default_factory=list)


@cache
def _known_traits() -> frozenset[str]:
    import os_traits

    return frozenset(os_traits.get_traits())


@cache
def _standard_classes() -> frozenset[str]:
    import os_resource_classes

    return frozenset(os_resource_classes.STANDARDS)


#: CPU flags whose os-traits name is not the flag's own.
_FLAG_ALIASES = {"AES": "AESNI", "FMA": "FMA3"}


def cpu_traits(features: Sequence[str]) -> list[str]:
    """The os-traits ``HW_CPU_X86_<FLAG>`` traits for CPU flags that have one."""
    known = _known_traits()
    found = set()
    for flag in features:
        name = str(flag).upper()
        # libvirt's "sse4.2" is os-traits' SSE42, "aes" is AESNI and "fma" FMA3 (as
        # Nova's libvirt driver maps them); other flags map by name.
        name = _FLAG_ALIASES.get(name, name)
        for candidate in (name.replace(".", ""), name.replace(".", "_")):
            if f"HW_CPU_X86_{candidate}" in known:
                found.add(f"HW_CPU_X86_{candidate}")
                break
    return sorted(found)


def driver_traits(hypervisor_type: str | None, cpu_features: Sequence[str]) -> list[str]:
    """The traits a virt driver reports for a node: CPU feature traits, and the libvirt
    driver's capability traits when the hypervisor is QEMU or KVM (the default)."""
    traits = set(cpu_traits(cpu_features))
    if (hypervisor_type or "QEMU").upper() in LIBVIRT_HYPERVISORS:
        traits.update(t for t in LIBVIRT_CAPABILITY_TRAITS if t in _known_traits())
    return sorted(traits)


def check_trait(name: Any, where: str) -> str:
    """A trait name Placement would accept: os-traits' or ``CUSTOM_[A-Z0-9_]+``."""
    if not isinstance(name, str):
        raise CloudFileError(f"{where}: expected a trait name, got {name!r}")
    if name in _known_traits() or _CUSTOM.match(name):
        return name
    raise CloudFileError(f"{where}: unknown trait {name!r} (a standard os-traits name, or "
                         "CUSTOM_ followed by A-Z, 0-9 and _)")


def check_class(name: Any, where: str) -> str:
    """A resource class Placement would accept: standard, or ``CUSTOM_[A-Z0-9_]+``."""
    if not isinstance(name, str):
        raise CloudFileError(f"{where}: expected a resource class name, got {name!r}")
    if name in _standard_classes() or _CUSTOM.match(name):
        return name
    raise CloudFileError(f"{where}: unknown resource class {name!r} (a standard "
                         "os-resource-classes name, or CUSTOM_ followed by A-Z, 0-9 and _)")


def read_traits(value: Any, where: str) -> list[str]:
    """A list of trait names (each checked), duplicates dropped, order kept."""
    if not isinstance(value, list):
        raise CloudFileError(f"{where}: expected a list of trait names, got {value!r}")
    return list(dict.fromkeys(check_trait(t, f"{where}[{i}]") for i, t in enumerate(value)))


def read_inventory(value: Any, where: str) -> dict[str, Any]:
    """One inventory, Placement's defaults filled in and its rules checked."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"total": value}
    if not isinstance(value, Mapping):
        raise CloudFileError(f"{where}: expected a total or a mapping with total, got {value!r}")
    unknown = sorted(set(map(str, value)) - set(_INVENTORY_FIELDS))
    if unknown:
        raise CloudFileError(f"{where}: unknown field(s) {', '.join(unknown)} (known: "
                             f"{', '.join(_INVENTORY_FIELDS)})")
    if "total" not in value:
        raise CloudFileError(f"{where}.total: required field is missing")
    inv: dict[str, Any] = {}
    for key, default, minimum in (("total", None, 1), ("reserved", 0, 0), ("min_unit", 1, 1),
                                  ("max_unit", None, 1), ("step_size", 1, 1)):
        raw = value.get(key, default if key != "max_unit" else inv["total"])
        if isinstance(raw, bool) or not isinstance(raw, int) or not minimum <= raw <= MAX_INT:
            raise CloudFileError(f"{where}.{key}: expected an integer from {minimum} to "
                                 f"{MAX_INT} (Placement's bounds), got {raw!r}")
        inv[key] = raw
    ratio = value.get("allocation_ratio", 1.0)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0 \
            or ratio != ratio or ratio > MAX_RATIO:
        raise CloudFileError(f"{where}.allocation_ratio: expected a number > 0 up to "
                             f"{MAX_RATIO:g}, got {ratio!r}")
    inv["allocation_ratio"] = float(ratio)
    if inv["reserved"] > inv["total"]:
        raise CloudFileError(f"{where}.reserved: {inv['reserved']} is more than total "
                             f"{inv['total']}")
    if inv["min_unit"] > inv["max_unit"]:
        raise CloudFileError(f"{where}.min_unit: {inv['min_unit']} is more than max_unit "
                             f"{inv['max_unit']}")
    return inv


def read_resources(value: Any, where: str, *, host_fields: bool) -> dict[str, dict[str, Any]]:
    """A ``resources`` mapping: class -> inventory. On a host entry (``host_fields``) the
    classes its own fields give are refused, naming the field to use."""
    if not isinstance(value, Mapping):
        raise CloudFileError(f"{where}: expected a mapping of resource class to inventory, "
                             f"got {value!r}")
    out = {}
    for rc, inv in value.items():
        check_class(rc, f"{where}.{rc}")
        if host_fields and rc in HOST_FIELD_CLASSES:
            raise CloudFileError(f"{where}.{rc}: given by the host's "
                                 f"{HOST_FIELD_CLASSES[rc]} field, not under resources")
        out[str(rc)] = read_inventory(inv, f"{where}.{rc}")
    return out


def read_nested(value: Any, where: str) -> list[ProviderSpec]:
    """A host's ``providers``: each after its parent, names unique."""
    if not isinstance(value, list):
        raise CloudFileError(f"{where}: expected a list of providers, got {value!r}")
    out: list[ProviderSpec] = []
    names: set[str] = set()
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, Mapping):
            raise CloudFileError(f"{at}: expected a mapping, got {item!r}")
        unknown = sorted(set(map(str, item)) - {"name", "parent", "resources", "traits"})
        if unknown:
            raise CloudFileError(f"{at}: unknown field(s) {', '.join(unknown)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise CloudFileError(f"{at}.name: expected a provider name, got {name!r}")
        if name in names:
            raise CloudFileError(f"{at}.name: duplicate provider {name!r} on this host")
        parent = item.get("parent")
        if parent is not None and parent not in names:
            raise CloudFileError(f"{at}.parent: {parent!r} is no provider listed before it "
                                 "on this host (leave parent out for the root)")
        names.add(name)
        out.append(ProviderSpec(
            name=name, parent=parent,
            resources=read_resources(item.get("resources") or {}, f"{at}.resources",
                                     host_fields=False),
            traits=read_traits(item.get("traits") or [], f"{at}.traits")))
    return out


def read_sharing(value: Any, aggregate_names: set[str]) -> list[ProviderSpec]:
    """The top-level ``sharing_providers``."""
    if not isinstance(value, list):
        raise CloudFileError(f"sharing_providers: expected a list, got {value!r}")
    out: list[ProviderSpec] = []
    for i, item in enumerate(value):
        at = f"sharing_providers[{i}]"
        if not isinstance(item, Mapping):
            raise CloudFileError(f"{at}: expected a mapping, got {item!r}")
        unknown = sorted(set(map(str, item)) - {"name", "uuid", "resources", "traits",
                                                "aggregates"})
        if unknown:
            raise CloudFileError(f"{at}: unknown field(s) {', '.join(unknown)}")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise CloudFileError(f"{at}.name: expected a provider name, got {name!r}")
        if any(p.name == name for p in out):
            raise CloudFileError(f"{at}.name: duplicate sharing provider {name!r}")
        aggs = item.get("aggregates")
        if not isinstance(aggs, list) or not aggs:
            raise CloudFileError(f"{at}.aggregates: expected a non-empty list of aggregate "
                                 f"names, got {aggs!r}")
        for j, agg in enumerate(aggs):
            if agg not in aggregate_names:
                raise CloudFileError(f"{at}.aggregates[{j}]: no aggregate named {agg!r} in "
                                     "aggregates")
        resources = read_resources(item.get("resources"), f"{at}.resources", host_fields=False)
        if not resources:
            raise CloudFileError(f"{at}.resources: a sharing provider shares something; "
                                 "give at least one inventory")
        uuid = item.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            raise CloudFileError(f"{at}.uuid: expected a uuid, got {uuid!r}")
        traits = read_traits(item.get("traits") or [], f"{at}.traits")
        if SHARING_TRAIT not in traits:
            traits.append(SHARING_TRAIT)
        out.append(ProviderSpec(name=name, uuid=uuid, resources=resources, traits=traits,
                                aggregates=[str(a) for a in aggs]))
    return out
