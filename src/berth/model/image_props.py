"""The types of Nova's image properties (``ImageMetaProps`` fields) and how values coerce.

Glance hands Nova every image property as text. Nova's ``ImageMetaProps`` coerces each
known field to its declared type while the object is built, and refuses the image
("Invalid image metadata", HTTP 400) when a value does not fit; Berth does the same, so
``hw_boot_menu: "0"`` is False rather than a truthy string and ``hw_cpu_cores: "lots"`` is
an error before anything is scheduled. The kinds of field:

* **integer** — ``int(text)``: ``"4"`` and ``" 4 "`` fit, ``"4.0"`` and ``"lots"`` do not
  (``hw_maxphysaddr_bits`` must also be >= 0);
* **boolean** (Nova's FlexibleBooleanField) — True for ``1 t true on y yes`` in any case,
  False for anything else: a boolean property is never an error;
* **string** — the text as given (a number is written out with ``str``);
* **enum** — a string from the field's list; architecture, hypervisor type and VM mode are
  lower-cased and their aliases resolved first (``AMD64`` is ``x86_64``, ``xapi`` is
  ``xen``, ``pv`` is ``xen``), ``os_type`` and the SCSI and VIF models are lower-cased and
  the SCSI/VIF models' VMware names translated (``VirtualE1000`` is ``e1000``);
* **version predicate** — ``img_hv_requested_version`` must read like ``>=6.0,<7``;
* **lists** — ``traits_required`` (strings: ``trait:NAME: required`` keys, as Glance
  images carry them, or a list); ``hw_numa_cpus`` / ``hw_numa_mem`` from the per-node keys
  ``hw_numa_cpus.N`` (CPU sets such as ``0-3,^2``) and ``hw_numa_mem.N`` (MB), N counting
  from 0 to the first gap, at most 128 nodes; ``img_mappings`` and
  ``img_block_device_mapping`` (lists of mappings of nullable strings, or their JSON text).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from berth.config import ARCHITECTURES
from berth.errors import ImagePropertyError
from berth.model.hvspec import ARCH_ALIASES, HV_ALIASES, HV_TYPES, VM_MODE_ALIASES, VM_MODES

#: Nova's ``ImageMetaProps.NUMA_NODES_MAX``: per-node keys past this index are not read.
NUMA_NODES_MAX = 128

_TRUE_WORDS = frozenset(["1", "t", "true", "on", "y", "yes"])


class _Unfit(ValueError):
    """A value does not fit a field type (the message says what was expected)."""


def show(value: Any) -> str:
    """``repr`` of a value, shortened for messages."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# --------------------------------------------------------------------------- scalar types
def string(value: Any) -> str:
    """Text as given; ints and floats written out (as oslo's StringField accepts them)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    raise _Unfit("expected a string")


def integer(value: Any) -> int:
    """An int, or text that ``int()`` reads."""
    if isinstance(value, bool):
        raise _Unfit("expected an integer")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            pass
    raise _Unfit("expected an integer")


def non_negative_integer(value: Any) -> int:
    """An integer >= 0."""
    number = integer(value)
    if number < 0:
        raise _Unfit("expected an integer >= 0")
    return number


def flexible_boolean(value: Any) -> bool:
    """Nova's FlexibleBooleanField: True for 1/t/true/on/y/yes (any case), else False."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in _TRUE_WORDS


class Enum:
    """A string from a fixed list, after an optional normalization (lower-casing, aliases)."""

    def __init__(self, values: Iterable[str] | Callable[[], Iterable[str]],
                 aliases: Mapping[str, str] | None = None, lower: bool = False) -> None:
        self._source = values
        self._values: tuple[str, ...] | None = None
        self._valid: frozenset[str] = frozenset()
        self.aliases = dict(aliases or {})
        self.lower = lower

    @property
    def values(self) -> tuple[str, ...]:
        """The valid values (a callable source is read once, on first use)."""
        if self._values is None:
            source = self._source() if callable(self._source) else self._source
            self._values = tuple(source)
            self._valid = frozenset(self._values)
        return self._values

    def __call__(self, value: Any) -> str:
        text = string(value)
        if self.lower:
            text = text.lower()
        text = self.aliases.get(text, text)
        if self._values is None:
            self.values  # noqa: B018  (fills _valid)
        if text not in self._valid:
            raise _Unfit(f"expected one of {', '.join(self.values)}")
        return text


def _hv_types() -> Iterable[str]:
    return sorted(HV_TYPES)  # one list for the filter and the property


def _vm_modes() -> Iterable[str]:
    return sorted(VM_MODES)


def version_predicate(value: Any) -> str:
    """Text such as ``>=6.0,<7`` (comma-separated ``<op> <version>`` conditions)."""
    from berth.filters.image_properties import parse_version_predicate

    text = string(value)
    if text.strip():
        try:
            parse_version_predicate(text)
        except ImagePropertyError:
            raise _Unfit("expected a version predicate such as '>=6.0,<7'") from None
    return text


# --------------------------------------------------------------------------- list types
def list_of_strings(value: Any) -> list[str]:
    """A list of strings (a single string is not a list)."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise _Unfit("expected a list of strings")
    return [string(item) for item in value]


def cpu_set(value: Any) -> set[int]:
    """A CPU set: text such as ``0-3,^2`` or a collection of CPU numbers."""
    if isinstance(value, (set, frozenset, list, tuple)):
        cpus = set()
        for cpu in value:
            try:
                cpus.add(non_negative_integer(cpu))
            except _Unfit:
                raise _Unfit("expected CPU numbers >= 0") from None
        return cpus
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _Unfit("expected a CPU set such as '0-3,^2'")
    from berth.hardware.numa import parse_cpu_spec

    try:
        return parse_cpu_spec(str(value))
    except ValueError as exc:
        raise _Unfit(f"expected a CPU set such as '0-3,^2' ({exc})") from None


def _list_of(element: Callable[[Any], Any], what: str) -> Callable[[Any], list[Any]]:
    def coerce(value: Any) -> list[Any]:
        if not isinstance(value, (list, tuple)):
            raise _Unfit(f"expected a list of {what}")
        return [element(item) for item in value]

    return coerce


def list_of_nullable_string_dicts(value: Any) -> list[dict[str, str | None]]:
    """Block device mappings: a list of mappings whose values are strings or null (JSON
    text of one, as Glance stores them, is decoded)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise _Unfit("expected a list of mappings (or its JSON text)") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(d, Mapping) for d in value):
        raise _Unfit("expected a list of mappings (or its JSON text)")
    return [{str(k): (None if v is None else string(v)) for k, v in d.items()} for d in value]


# --------------------------------------------------------------------------- the fields
_DISK_BUS = Enum(("fdc", "ide", "sata", "scsi", "usb", "virtio", "xen", "lxc", "uml"))
_ARCHITECTURE = Enum(ARCHITECTURES, ARCH_ALIASES, lower=True)
#: VMware adapter names the VIF model field still takes (lower-cased first).
_VIF_LEGACY = {"virtuale1000": "e1000", "virtuale1000e": "e1000e", "virtualpcnet32": "pcnet",
               "virtualsriovethernetcard": "sriov", "virtualvmxnet": "vmxnet",
               "virtualvmxnet3": "vmxnet3"}

#: Every field Berth knows, with its coercion. Nova's types; the few Nova has no field for
#: (``hw_cpu_realtime``, ``hw_emulator_threads_policy``) are typed like their flavor twins.
FIELD_TYPES: dict[str, Callable[[Any], Any]] = {
    "hw_architecture": _ARCHITECTURE,
    "hw_emulation_architecture": _ARCHITECTURE,
    "hw_auto_disk_config": string,
    "hw_boot_menu": flexible_boolean,
    "hw_cdrom_bus": _DISK_BUS,
    "hw_cpu_cores": integer,
    "hw_cpu_max_cores": integer,
    "hw_cpu_max_sockets": integer,
    "hw_cpu_max_threads": integer,
    "hw_cpu_policy": Enum(("dedicated", "shared", "mixed")),
    "hw_cpu_thread_policy": Enum(("prefer", "isolate", "require")),
    "hw_cpu_realtime_mask": string,
    "hw_cpu_sockets": integer,
    "hw_cpu_threads": integer,
    "hw_device_id": integer,
    "hw_disk_bus": _DISK_BUS,
    "hw_disk_type": string,
    "hw_ephemeral_encryption": flexible_boolean,
    "hw_ephemeral_encryption_format": Enum(("plain", "luks", "luksv2")),
    "hw_ephemeral_encryption_secret_uuid": string,
    "hw_firmware_type": Enum(("uefi", "bios")),
    "hw_firmware_stateless": flexible_boolean,
    "hw_floppy_bus": _DISK_BUS,
    "hw_input_bus": Enum(("usb", "virtio")),
    "hw_ipxe_boot": flexible_boolean,
    "hw_locked_memory": flexible_boolean,
    "hw_machine_type": string,
    "hw_maxphysaddr_mode": Enum(("passthrough", "emulate")),
    "hw_maxphysaddr_bits": non_negative_integer,
    "hw_mem_encryption": flexible_boolean,
    "hw_mem_encryption_model": Enum(("amd-sev", "amd-sev-es", "amd-sev-snp", "intel-tdx")),
    "hw_mem_page_size": string,
    "hw_numa_nodes": integer,
    "hw_numa_cpus": _list_of(cpu_set, "CPU sets"),
    "hw_numa_mem": _list_of(integer, "integers"),
    "hw_pci_numa_affinity_policy": Enum(("required", "legacy", "preferred", "socket")),
    "hw_pmu": flexible_boolean,
    "hw_pointer_model": Enum(("usbtablet",)),
    "hw_qemu_guest_agent": flexible_boolean,
    "hw_rescue_bus": _DISK_BUS,
    "hw_rescue_device": Enum(("cdrom", "disk", "floppy", "fs", "lun")),
    "hw_rng_model": Enum(("virtio",)),
    "hw_serial_port_count": integer,
    "hw_time_hpet": flexible_boolean,
    "hw_tpm_model": Enum(("tpm-tis", "tpm-crb")),
    "hw_tpm_version": Enum(("1.2", "2.0")),
    "hw_video_model": Enum(("vga", "cirrus", "vmvga", "xen", "qxl", "virtio", "gop", "none",
                            "bochs")),
    "hw_video_ram": integer,
    "hw_vif_model": Enum(("virtio", "ne2k_pci", "pcnet", "rtl8139", "e1000", "e1000e",
                          "netfront", "spapr-vlan", "lan9118", "sriov", "vmxnet", "vmxnet3",
                          "igb"), _VIF_LEGACY, lower=True),
    "hw_vif_multiqueue_enabled": flexible_boolean,
    "hw_viommu_model": Enum(("intel", "smmuv3", "virtio", "auto")),
    "hw_virtio_packed_ring": flexible_boolean,
    "hw_vm_mode": Enum(_vm_modes, VM_MODE_ALIASES, lower=True),
    "hw_watchdog_action": Enum(("none", "pause", "poweroff", "reset", "disabled")),
    "hw_sound_model": Enum(("sb16", "es1370", "pcspk", "ac97", "ich6", "ich9", "usb",
                            "virtio")),
    "hw_scsi_model": Enum(("buslogic", "ibmvscsi", "lsilogic", "lsisas1068", "lsisas1078",
                           "virtio-scsi", "vmpvscsi"),
                          {"lsilogicsas": "lsisas1068", "paravirtual": "vmpvscsi"}, lower=True),
    "hw_cpu_realtime": flexible_boolean,
    "hw_emulator_threads_policy": Enum(("share", "isolate")),
    "hw_usb_model": string,
    "hw_redirected_usb_ports": non_negative_integer,
    "img_bdm_v2": flexible_boolean,
    "img_bittorrent": flexible_boolean,
    "img_block_device_mapping": list_of_nullable_string_dicts,
    "img_cache_in_nova": flexible_boolean,
    "img_compression_level": integer,
    "img_config_drive": Enum(("optional", "mandatory")),
    "img_hide_hypervisor_id": flexible_boolean,
    "img_hv_requested_version": version_predicate,
    "img_hv_type": Enum(_hv_types, HV_ALIASES, lower=True),
    "img_linked_clone": flexible_boolean,
    "img_mappings": list_of_nullable_string_dicts,
    "img_owner_id": string,
    "img_root_device_name": string,
    "img_signature": string,
    "img_signature_certificate_uuid": string,
    "img_signature_hash_method": Enum(("SHA-224", "SHA-256", "SHA-384", "SHA-512")),
    "img_signature_key_type": Enum(("DSA", "ECC_SECP384R1", "ECC_SECP521R1", "ECC_SECT409K1",
                                    "ECC_SECT409R1", "ECC_SECT571K1", "ECC_SECT571R1",
                                    "RSA-PSS")),
    "img_use_agent": flexible_boolean,
    "img_version": integer,
    "os_admin_user": string,
    "os_command_line": string,
    "os_distro": string,
    "os_require_quiesce": flexible_boolean,
    "os_secure_boot": Enum(("required", "disabled", "optional")),
    "os_skip_agent_inject_files_at_boot": flexible_boolean,
    "os_skip_agent_inject_ssh": flexible_boolean,
    "os_type": Enum(("linux", "windows"), lower=True),
    "traits_required": list_of_strings,
}

#: Legacy image property names, translated as Nova's ``ImageMetaProps.from_dict`` does
#: (seed 000 sets images with ``--property architecture=... --property hypervisor_type=...``).
LEGACY_IMAGE_PROPERTIES: dict[str, str] = {
    "architecture": "hw_architecture",
    "owner_id": "img_owner_id",
    "vmware_disktype": "hw_disk_type",
    "vmware_image_version": "img_version",
    "vmware_ostype": "os_distro",
    "auto_disk_config": "hw_auto_disk_config",
    "ipxe_boot": "hw_ipxe_boot",
    "xenapi_device_id": "hw_device_id",
    "xenapi_image_compression_level": "img_compression_level",
    "vmware_linked_clone": "img_linked_clone",
    "xenapi_use_agent": "img_use_agent",
    "xenapi_skip_agent_inject_ssh": "os_skip_agent_inject_ssh",
    "xenapi_skip_agent_inject_files_at_boot": "os_skip_agent_inject_files_at_boot",
    "cache_in_nova": "img_cache_in_nova",
    "vm_mode": "hw_vm_mode",
    "bittorrent": "img_bittorrent",
    "mappings": "img_mappings",
    "block_device_mapping": "img_block_device_mapping",
    "bdm_v2": "img_bdm_v2",
    "root_device_name": "img_root_device_name",
    "hypervisor_version_requires": "img_hv_requested_version",
    "hypervisor_type": "img_hv_type",
}

_LEGACY_KEYS = frozenset([*LEGACY_IMAGE_PROPERTIES, "vmware_adaptertype"])

#: Fields read from per-node keys (``hw_numa_cpus.0``, ``hw_numa_cpus.1``...).
PER_NODE_FIELDS: dict[str, Callable[[Any], Any]] = {"hw_numa_cpus": cpu_set,
                                                    "hw_numa_mem": integer}


def coerce_properties(properties: Mapping[str, Any]) -> dict[str, Any]:
    """The typed values of the known fields among ``properties``, as Nova builds them.

    Legacy names first, then ``trait:NAME: required`` keys, then the current names (so a
    current name wins over its legacy alias), then the per-node NUMA keys. A None value is
    unset. Raises :class:`ImagePropertyError` naming the first value that does not fit.
    """
    values: dict[str, Any] = {}

    def put(key: str, name: str, value: Any) -> None:
        if value is None:
            return
        try:
            values[name] = FIELD_TYPES[name](value)
        except _Unfit as unfit:
            raise ImagePropertyError(key, value, str(unfit)) from None

    if not properties.keys().isdisjoint(_LEGACY_KEYS):
        # Each legacy name has its own field, so the order among them does not matter.
        for legacy, name in LEGACY_IMAGE_PROPERTIES.items():
            if legacy in properties:
                put(legacy, name, properties[legacy])
        adapter = properties.get("vmware_adaptertype")
        if adapter == "ide":
            put("vmware_adaptertype", "hw_disk_bus", "ide")
        elif adapter:
            put("vmware_adaptertype", "hw_disk_bus", "scsi")
            put("vmware_adaptertype", "hw_scsi_model", adapter)

    traits: list[str] = []
    per_node = False
    for key, value in properties.items():
        if key in FIELD_TYPES:
            if key in PER_NODE_FIELDS and not isinstance(value, (list, tuple)):
                # Nova reads these fields only from the per-node keys; a lone value is ignored.
                continue
            put(key, key, value)
        elif isinstance(key, str):
            if key.startswith("trait:"):
                if str(value) == "required":
                    traits.append(key[len("trait:"):])
            elif key.startswith("hw_numa_"):
                per_node = True

    if traits:
        explicit = values.get("traits_required", [])
        values["traits_required"] = list(dict.fromkeys([*traits, *explicit]))
    if per_node:
        values.update(_per_node_values(properties))
    return values


def _per_node_values(properties: Mapping[str, Any]) -> dict[str, list[Any]]:
    values: dict[str, list[Any]] = {}
    for name, element in PER_NODE_FIELDS.items():
        nodes: list[Any] = []
        for index in range(NUMA_NODES_MAX):
            key = f"{name}.{index}"
            if key not in properties:
                break
            value = properties[key]
            try:
                nodes.append(element(value))
            except _Unfit as unfit:
                raise ImagePropertyError(key, value, str(unfit)) from None
        if nodes:
            values[name] = nodes
    return values
