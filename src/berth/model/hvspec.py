"""The hypervisor specs of a host (Nova's ``HVSpec``): the names Nova accepts for a
``supported_instances`` triple's architecture, hypervisor type and VM mode, their
aliases, and a host's triple as Nova's host state holds it (canonicalized)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from berth.config import ARCHITECTURES

HV_TYPES = frozenset([
    "baremetal", "bhyve", "docker", "fake", "hyperv", "ironic", "kqemu", "kvm", "lxc", "lxd",
    "openvz", "parallels", "vz", "phyp", "qemu", "test", "uml", "vmware", "vbox", "xen",
    "zvm", "prsm",
])  # fmt: skip
VM_MODES = frozenset(["hvm", "xen", "uml", "exe"])
ARCH_ALIASES = {"i386": "i686", "i486": "i686", "i586": "i686", "x86_32": "i686",
                "x86_32p": "i686", "amd64": "x86_64"}
HV_ALIASES = {"xapi": "xen"}
VM_MODE_ALIASES = {"pv": "xen", "hv": "hvm", "baremetal": "hvm"}


def host_triple(triple: Sequence[Any]) -> tuple[Any, ...]:
    """A host's ``supported_instances`` triple as Nova compares it: ``HVSpec`` fields
    canonicalize what a compute reports (``QEMU`` -> ``qemu``, ``amd64`` -> ``x86_64``,
    ``pv`` -> ``xen``), and ``HVSpec.from_list`` reads three values. A value Nova would
    refuse to load is kept as it is (it matches no image value)."""
    out: list[Any] = []
    for value, aliases, valid in zip(
            triple, (ARCH_ALIASES, HV_ALIASES, VM_MODE_ALIASES),
            (frozenset(ARCHITECTURES), HV_TYPES, VM_MODES), strict=False):
        name = value.lower() if isinstance(value, str) else value
        name = aliases.get(name, name) if isinstance(name, str) else name
        out.append(name if name in valid else value)
    return tuple(out[:3])
