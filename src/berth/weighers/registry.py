"""The explicit table of built-in weighers: config name -> ``module:Class``.

``all_weighers`` loads them in the order Nova 34 does (reference §7.2, "default loaded
set"); the order only affects float summation.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from berth.weighers.base import BaseHostWeigher

BUILTIN_WEIGHERS: dict[str, str] = {
    "CrossCellWeigher": "berth.weighers.cross_cell:CrossCellWeigher",
    "NumInstancesWeigher": "berth.weighers.num_instances:NumInstancesWeigher",
    "MetricsWeigher": "berth.weighers.metrics:MetricsWeigher",
    "CPUWeigher": "berth.weighers.cpu:CPUWeigher",
    "BuildFailureWeigher": "berth.weighers.build_failure:BuildFailureWeigher",
    "ServerGroupSoftAffinityWeigher": "berth.weighers.affinity:ServerGroupSoftAffinityWeigher",
    "ServerGroupSoftAntiAffinityWeigher": (
        "berth.weighers.affinity:ServerGroupSoftAntiAffinityWeigher"
    ),
    "RAMWeigher": "berth.weighers.ram:RAMWeigher",
    "DiskWeigher": "berth.weighers.disk:DiskWeigher",
    "PCIWeigher": "berth.weighers.pci:PCIWeigher",
    "ImagePropertiesWeigher": "berth.weighers.image_properties:ImagePropertiesWeigher",
    "IoOpsWeigher": "berth.weighers.io_ops:IoOpsWeigher",
    "HypervisorVersionWeigher": "berth.weighers.hypervisor_version:HypervisorVersionWeigher",
}


def load_builtin(name: str) -> type[BaseHostWeigher]:
    """Import and return the built-in weigher class registered as ``name``."""
    module_name, _, class_name = BUILTIN_WEIGHERS[name].partition(":")
    cls: type[BaseHostWeigher] = getattr(importlib.import_module(module_name), class_name)
    return cls


def builtin_weigher_classes() -> list[type[BaseHostWeigher]]:
    """Every built-in weigher class, in Nova's loading order."""
    return [load_builtin(name) for name in BUILTIN_WEIGHERS]
