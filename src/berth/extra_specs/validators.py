"""Flavor extra-spec validators: the keys Berth understands and what their values may be.

Each :class:`ExtraSpecValidator` names a key (``hw:cpu_policy``) or a key template with
placeholders (``hw:numa_cpus.{N}``, ``resources{group}:{resource_class}``), describes it,
and states its value rule: an enum, an int range, a regex, a boolean, or the operator
grammar of :mod:`berth.extra_specs.ops` (for ``capabilities:*`` and
``aggregate_instance_extra_specs:*``, which filters match against host values).

Custom filters register validators for their own keys, as seed 000 describes for Nova:
a package exposes a module with a ``register()`` function returning a list of validators
under the ``berth.extra_spec_validators`` entry-point group (Nova's group name,
``nova.api.extra_spec_validators``, is read too):

    entry_points={"berth.extra_spec_validators": ["acme = acmefilter.validators"]}

:func:`check_flavor` returns one clear problem per bad key or value. A namespaced key
that no validator knows is a problem only when its namespace is a known one (``hw:foo``
is a typo; ``acme:foo`` may belong to a filter Berth has no validator for). Keys without
a namespace are allowed: ComputeCapabilitiesFilter and AggregateInstanceExtraSpecsFilter
treat them as capabilities, so only their operator grammar is checked.
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Protocol

import os_resource_classes
import os_traits

from berth.errors import ConfigError
from berth.extra_specs.ops import compile_requirement, operator_lookalike

LOG = logging.getLogger(__name__)

#: Entry-point group of plugin validator modules (each with ``register()``).
ENTRY_POINT_GROUP = "berth.extra_spec_validators"
#: Nova's group name, read too so a Nova filter package works unchanged.
NOVA_ENTRY_POINT_GROUP = "nova.api.extra_spec_validators"

_VALUE_KEYS = frozenset(["type", "enum", "min", "max", "pattern", "grammar", "description"])
_TYPES: dict[Any, str] = {str: "str", int: "int", bool: "bool", "str": "str", "int": "int",
                          "bool": "bool", "string": "str", "integer": "int", "boolean": "bool"}
_TRUE = frozenset(["1", "t", "true", "on", "y", "yes"])
_FALSE = frozenset(["0", "f", "false", "off", "n", "no"])
_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_]*)\}")
#: Placeholders that need no declared pattern.
_DEFAULT_PARAMETER_PATTERNS = {"N": r"\d+"}


def _compile_template(template: str, patterns: Mapping[str, str]) -> re.Pattern[str]:
    parts: list[str] = []
    pos = 0
    for found in _PLACEHOLDER.finditer(template):
        parts.append(re.escape(template[pos:found.start()]))
        parts.append(f"(?:{patterns[found.group(1)]})")
        pos = found.end()
    parts.append(re.escape(template[pos:]))
    return re.compile("".join(parts))


@dataclass(frozen=True)
class ExtraSpecValidator:
    """A known extra-spec key (or key template) and the rule for its value.

    ``value`` is a mapping like Nova's: ``type`` (``str``, ``int`` or ``bool``), and
    optionally ``enum`` (allowed values), ``min``/``max`` (ints), ``pattern`` (a regex the
    whole value must match), ``grammar`` (True: the extra-spec operator grammar) and
    ``description``. ``parameters`` declare the placeholders of ``name``
    (``[{"name": "group", "pattern": "...", "description": "..."}]``); ``{N}`` defaults to
    digits. Construction raises :class:`~berth.errors.ConfigError` on a malformed rule.
    """

    name: str
    description: str
    value: Mapping[str, Any] = field(default_factory=lambda: {"type": str})
    parameters: Sequence[Mapping[str, str]] = ()
    deprecated: bool = False

    def __post_init__(self) -> None:
        where = f"extra spec validator {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"{where}: name must be a non-empty string")
        unknown = set(self.value) - _VALUE_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown value keys {sorted(unknown)} "
                              f"(allowed: {', '.join(sorted(_VALUE_KEYS))})")
        kind = _TYPES.get(self.value.get("type", str))
        if kind is None:
            raise ConfigError(f"{where}: value type {self.value.get('type')!r} is not str, int or bool")
        patterns = dict(_DEFAULT_PARAMETER_PATTERNS)
        for param in self.parameters:
            if "name" not in param or "pattern" not in param:
                raise ConfigError(f"{where}: each parameter needs a name and a pattern")
            patterns[param["name"]] = param["pattern"]
        missing = [p for p in _PLACEHOLDER.findall(self.name) if p not in patterns]
        if missing:
            raise ConfigError(f"{where}: placeholders {missing} have no parameter pattern")
        try:
            name_regex = _compile_template(self.name, patterns)
            namespace, sep, _ = self.name.partition(":")
            namespace_regex = _compile_template(namespace, patterns) if sep else None
            value_regex = re.compile(self.value["pattern"]) if "pattern" in self.value else None
        except re.error as exc:
            raise ConfigError(f"{where}: bad regular expression: {exc}") from exc
        object.__setattr__(self, "_kind", kind)
        object.__setattr__(self, "_name_regex", name_regex)
        object.__setattr__(self, "_namespace_regex", namespace_regex)
        object.__setattr__(self, "_value_regex", value_regex)

    @property
    def kind(self) -> str:
        """``str``, ``int`` or ``bool``."""
        kind: str = self.__dict__["_kind"]
        return kind

    @property
    def is_template(self) -> bool:
        """True when the name has placeholders."""
        return bool(_PLACEHOLDER.search(self.name))

    @property
    def namespace_regex(self) -> re.Pattern[str] | None:
        """The namespace part of the name (before the first colon) as a regex, or None."""
        regex: re.Pattern[str] | None = self.__dict__["_namespace_regex"]
        return regex

    def matches(self, key: str) -> bool:
        """True if ``key`` is this validator's name or an instance of its template."""
        regex: re.Pattern[str] = self.__dict__["_name_regex"]
        return regex.fullmatch(key) is not None

    def problem(self, key: str, value: Any) -> str | None:
        """Why ``value`` is not acceptable for ``key``, or None."""
        if not isinstance(value, str):
            return f"{key}={value!r}: extra spec values must be strings"
        rule = self.value
        text = value
        if self.kind == "bool":
            if text.strip().lower() not in _TRUE | _FALSE:
                return f"{key}={value!r}: must be a boolean (true/false, yes/no, on/off, 1/0)"
            return None
        if self.kind == "int":
            try:
                number = int(text)
            except ValueError:
                return f"{key}={value!r}: must be an integer"
            low, high = rule.get("min"), rule.get("max")
            if (low is not None and number < low) or (high is not None and number > high):
                return f"{key}={value!r}: must be an integer {_range(low, high)}"
            if "enum" in rule and number not in [int(v) for v in rule["enum"]]:
                return f"{key}={value!r}: must be one of {', '.join(map(str, rule['enum']))}"
            return None
        if "enum" in rule and text not in [str(v) for v in rule["enum"]]:
            return f"{key}={value!r}: must be one of {', '.join(map(str, rule['enum']))}"
        regex: re.Pattern[str] | None = self.__dict__["_value_regex"]
        if regex is not None and regex.fullmatch(text) is None:
            if "description" in rule:
                return f"{key}={value!r}: must be {rule['description']}"
            return f"{key}={value!r}: must match {regex.pattern!r}"
        if rule.get("grammar"):
            return grammar_problem(key, text)
        return None


def _range(low: Any, high: Any) -> str:
    if low is not None and high is not None:
        return f"between {low} and {high}"
    return f">= {low}" if low is not None else f"<= {high}"


def grammar_problem(key: str, value: str) -> str | None:
    """The operator-grammar problem of a requirement (bare ``<or>``, a non-numeric
    operand of a numeric operator), or None."""
    error = compile_requirement(value).error
    return f"{key}={value!r}: {error}" if error else None


# ----------------------------------------------------------------------------- built-ins
_CPUSET = r"\s*\^?\d+(?:\s*-\s*\d+)?(?:\s*,\s*\^?\d+(?:\s*-\s*\d+)?)*\s*"
_GROUP = {"name": "group", "pattern": r"(?:[a-zA-Z0-9_-]{1,64})?",
          "description": "an optional request group suffix (1-64 of a-z A-Z 0-9 _ -)"}


def _enum(*values: str) -> dict[str, Any]:
    return {"type": str, "enum": list(values)}


_BOOL: dict[str, Any] = {"type": bool}


def _int(low: int | None = None, high: int | None = None) -> dict[str, Any]:
    rule: dict[str, Any] = {"type": int}
    if low is not None:
        rule["min"] = low
    if high is not None:
        rule["max"] = high
    return rule


def _quota_validators() -> list[ExtraSpecValidator]:
    """``quota:*``: hypervisor resource limits Nova's API accepts (no scheduler reads them).

    The VMware driver takes a limit, a reservation, a shares level and a shares count per
    resource; the libvirt driver takes CPU tuning, disk I/O throttling and VIF bandwidth
    numbers. The rules are Nova 34's (``nova/api/validation/extra_specs/quota.py``).
    """
    v = ExtraSpecValidator
    out: list[ExtraSpecValidator] = []
    for resource in ("cpu", "memory", "disk_io", "vif"):
        what = resource.replace("_", " ")
        out += [
            v(f"quota:{resource}_limit", f"Upper limit of {what} for the guest (VMware).",
              _int(0)),
            v(f"quota:{resource}_reservation", f"Guaranteed {what} for the guest (VMware).",
              _int()),
            v(f"quota:{resource}_shares_level", f"Shares level of {what} under contention "
              "(VMware).", _enum("custom", "high", "normal", "low")),
            v(f"quota:{resource}_shares_share", f"Number of {what} shares when the shares "
              "level is custom (VMware).", _int(0)),
        ]
    out += [v(f"quota:cpu_{key}", f"CPU {text} (libvirt).", rule) for key, text, rule in (
        ("shares", "time share weight relative to other guests", _int(0)),
        ("period", "enforcement interval in microseconds", _int(0)),
        # Nova sets no minimum: a negative quota means no limit to libvirt.
        ("quota", "bandwidth per period in microseconds", _int()),
    )]
    out += [v(f"quota:disk_{stat}_{metric}_sec", f"Disk {stat} throttle in {metric} per "
              "second (libvirt).", _int(0))
            for stat in ("read", "write", "total") for metric in ("bytes", "iops")]
    out += [v(f"quota:vif_{direction}_{metric}", f"{direction.capitalize()} VIF bandwidth "
              f"{metric} (libvirt).", _int(0))
            for direction in ("inbound", "outbound") for metric in ("average", "peak", "burst")]
    return out


def _vmware_validators() -> list[ExtraSpecValidator]:
    """``vmware:*``: free-form strings the VMware driver reads."""
    v = ExtraSpecValidator
    return [
        v("vmware:hw_version", "VMware virtual hardware version of the guest (places it on "
          "hosts that support that version).", {"type": str}),
        v("vmware:storage_policy", "Storage policy of new instances (ignored unless "
          "storage policy based management is enabled).", {"type": str}),
    ]


#: A decimal number of processing units as PowerVM takes it (``0.5``, ``1.25``).
_PROC_UNITS: dict[str, Any] = {"type": str, "pattern": r"\d+\.\d+",
                               "description": "a decimal such as 0.5 (a multiple of 0.05 "
                               "or 0.1, depending on the firmware)"}


def _powervm_validators() -> list[ExtraSpecValidator]:
    """``powervm:*``: LPAR settings of the (removed) PowerVM driver, still accepted by the
    API, with its value rules."""
    v = ExtraSpecValidator
    return [
        v("powervm:min_mem", "Minimum memory of the LPAR in MB (default: the flavor's "
          "memory).", _int(256)),
        v("powervm:max_mem", "Maximum memory of the LPAR in MB (default: the flavor's "
          "memory).", _int(256)),
        v("powervm:min_vcpu", "Minimum virtual processors of the LPAR (default: the flavor's "
          "vCPUs).", _int(1)),
        v("powervm:max_vcpu", "Maximum virtual processors of the LPAR (default: the flavor's "
          "vCPUs).", _int(1)),
        v("powervm:proc_units", "Desired processing units (default: half the vCPUs).",
          _PROC_UNITS),
        v("powervm:min_proc_units", "Minimum processing units (default: "
          "powervm:proc_units).", _PROC_UNITS),
        v("powervm:max_proc_units", "Maximum processing units (default: "
          "powervm:proc_units).", _PROC_UNITS),
        v("powervm:dedicated_proc", "Give the LPAR dedicated processors (default false).",
          _BOOL),
        v("powervm:shared_weight", "Weight of the LPAR in a shared processor pool.",
          _int(0, 255)),
        v("powervm:availability_priority", "Priority of the LPAR when a processor fails "
          "(default 128).", _int(0, 255)),
        v("powervm:uncapped", "Let a shared-processor LPAR use idle cycles beyond its "
          "entitlement.", _BOOL),
        v("powervm:dedicated_sharing_mode", "Whether dedicated processors lend idle cycles.",
          _enum("share_idle_procs", "keep_idle_procs", "share_idle_procs_active",
                "share_idle_procs_always")),
        v("powervm:processor_compatibility", "Processor compatibility mode of the LPAR.",
          _enum("default", "POWER6", "POWER6+", "POWER6_Enhanced", "POWER6+_Enhanced",
                "POWER7", "POWER8")),
        v("powervm:shared_proc_pool_name", "Shared processor pool to deploy into.",
          {"type": str}),
        v("powervm:srr_capability", "Allow simplified remote restart of the LPAR "
          "(default false).", _BOOL),
    ]


def builtin_validators() -> list[ExtraSpecValidator]:
    """The extra specs Berth's filters and placement translation understand."""
    v = ExtraSpecValidator
    resource_classes = "|".join(["CUSTOM_[A-Z0-9_]+", *map(re.escape, os_resource_classes.STANDARDS)])
    traits = "|".join(["CUSTOM_[A-Z0-9_]+", *map(re.escape, os_traits.get_traits())])
    return [
        # CPU pinning and topology (NUMATopologyFilter, pinning translation).
        v("hw:cpu_policy", "CPU pinning policy: shared (floating), dedicated (pinned PCPUs) "
          "or mixed.", _enum("shared", "dedicated", "mixed")),
        v("hw:cpu_thread_policy", "How pinned vCPUs use SMT siblings.",
          _enum("prefer", "isolate", "require")),
        v("hw:emulator_threads_policy", "Emulator threads share the guest's pCPUs or get "
          "one of their own (isolate adds one PCPU).", _enum("share", "isolate")),
        v("hw:cpu_dedicated_mask", "vCPUs pinned in a mixed policy instance (a CPU set).",
          {"type": str, "pattern": _CPUSET}),
        v("hw:cpu_realtime", "Give the guest real-time vCPUs.", _BOOL),
        v("hw:cpu_realtime_mask", "vCPUs that are (or, with ^, are not) real-time.",
          {"type": str, "pattern": _CPUSET}),
        *[v(f"hw:cpu_{kind}", f"Guest CPU topology: {kind.replace('_', ' ')}.", _int(1))
          for kind in ("sockets", "cores", "threads", "max_sockets", "max_cores", "max_threads")],
        v("hw:numa_nodes", "Number of guest NUMA nodes.", _int(1)),
        v("hw:numa_cpus.{N}", "vCPUs of guest NUMA node N (a CPU set).",
          {"type": str, "pattern": _CPUSET},
          parameters=[{"name": "N", "pattern": r"\d+", "description": "a NUMA node index"}]),
        v("hw:numa_mem.{N}", "Memory (MB) of guest NUMA node N.", _int(1),
          parameters=[{"name": "N", "pattern": r"\d+", "description": "a NUMA node index"}]),
        v("hw:mem_page_size", "Guest page size: small, large, any, or a size such as 2MB.",
          {"type": str, "pattern": r"(?:large|small|any|\d+(?:[kKMGT]i?)?(?:b|bit|B)?)"}),
        v("hw:pci_numa_affinity_policy", "NUMA affinity of PCI devices.",
          _enum("required", "legacy", "preferred", "socket")),
        v("hw:locked_memory", "Lock guest memory (needs huge pages or realtime).", _BOOL),
        # Checked by ComputeCapabilitiesFilter and placement translation.
        v("hw:maxphysaddr_bits", "Minimum physical address bits of the host CPU.", _int(1)),
        v("hw:maxphysaddr_mode", "Physical address bits: passthrough or emulate.",
          _enum("passthrough", "emulate")),
        v("hw:mem_encryption", "Encrypt guest memory (AMD SEV).", _BOOL),
        v("hw:mem_encryption_model", "Memory encryption model.", _enum("amd-sev", "amd-sev-es", "amd-sev-snp", "intel-tdx")),
        v("hw:tpm_version", "vTPM version.", _enum("1.2", "2.0")),
        v("hw:tpm_model", "vTPM model.", _enum("tpm-tis", "tpm-crb")),
        v("hw:tpm_secret_security", "Who holds the vTPM secret (default user).",
          _enum("user", "host", "deployment")),
        v("hw:virtio_packed_ring", "Use virtio packed virtqueues.", _BOOL),
        v("hw:sound_model", "Guest sound device model.",
          _enum("sb16", "es1370", "pcspk", "ac97", "ich6", "ich9", "usb", "virtio")),
        v("hw:firmware_stateless", "Boot with stateless firmware.", _BOOL),
        v("hw:boot_menu", "Show a boot menu.", _BOOL),
        v("hw:vif_multiqueue_enabled", "Enable multiqueue virtio NICs.", _BOOL),
        v("hw:pmu", "Expose a virtual performance monitoring unit.", _BOOL),
        v("hw:serial_port_count", "Number of serial ports.", _int(0)),
        v("hw:hide_hypervisor_id", "Hide the hypervisor signature from the guest.", _BOOL),
        v("hw:watchdog_action", "Action when the guest watchdog fires.",
          _enum("none", "pause", "poweroff", "reset", "disabled")),
        v("hw:viommu_model", "Virtual IOMMU model.", _enum("intel", "smmuv3", "virtio", "auto")),
        v("hw:time_hpet", "Expose an HPET timer.", _BOOL),
        v("hw:ephemeral_encryption", "Encrypt ephemeral storage.", _BOOL),
        v("hw:ephemeral_encryption_format", "Ephemeral encryption format.",
          _enum("plain", "luks", "luksv2")),
        # Nova's pattern, ([a-zA-Z0-9_]+(,)?)+, written without nested repetition (the
        # same strings, in linear time).
        v("hw:pmem", "Virtual persistent memory namespaces: labels, comma-separated (each "
          "asks placement for one CUSTOM_PMEM_NAMESPACE_<LABEL>).",
          {"type": str, "pattern": r"[a-zA-Z0-9_]+(?:,[a-zA-Z0-9_]+)*,?"}),
        v("hw:usb_model", "USB controller model (none: no controller).",
          _enum("none", "nec-xhci", "qemu-xhci")),
        v("hw:redirected_usb_ports", "Redirected USB ports of the guest.", _int(0, 15)),
        v("hw_rng:allowed", "Allow a random number generator device.", _BOOL),
        v("hw_rng:rate_bytes", "RNG bytes allowed per period.", _int(0)),
        v("hw_rng:rate_period", "RNG rate period (ms).", _int(0)),
        v("hw_video:ram_max_mb", "Maximum video RAM (MB).", _int(0)),
        v("os:secure_boot", "UEFI secure boot.", _enum("disabled", "required")),
        *_quota_validators(),
        *_vmware_validators(),
        *_powervm_validators(),
        # PciPassthroughFilter.
        v("pci_passthrough:alias", "PCI devices by alias: name:count[,name:count...].",
          {"type": str, "pattern": r"\s*[^:,\s]+\s*:\s*\d+\s*(?:,\s*[^:,\s]+\s*:\s*\d+\s*)*"}),
        # TrustedFilter (removed from Nova; kept for the seeds).
        v("trust:trusted_host", "Required attestation level of the host.",
          _enum("trusted", "untrusted", "unknown")),
        v("accel:device_profile", "Cyborg device profile name (adds COMPUTE_ACCELERATORS).",
          {"type": str}),
        # Placement translation (reference §8.5).
        # No minimum, as in Nova: a negative amount is accepted here and left out of the
        # request (with a warning) when the flavor is scheduled.
        v("resources{group}:{resource_class}", "Amount of a resource class in a request "
          "group.", _int(),
          parameters=[_GROUP, {"name": "resource_class", "pattern": resource_classes,
                               "description": "a standard resource class or CUSTOM_*"}]),
        v("trait{group}:{trait}", "Require or forbid a trait in a request group.",
          _enum("required", "forbidden"),
          parameters=[_GROUP, {"name": "trait", "pattern": traits,
                               "description": "a standard trait or CUSTOM_*"}]),
        v("group_policy", "How numbered request groups share providers.",
          _enum("none", "isolate")),
        v("hide_hypervisor_id", "Hide the hypervisor signature from the guest (the old "
          "name of hw:hide_hypervisor_id).", _BOOL, deprecated=True),
        # Matched by filters against host or aggregate values.
        v("capabilities:{key}", "A host capability (ComputeCapabilitiesFilter), with the "
          "extra-spec operator grammar.", {"type": str, "grammar": True},
          parameters=[{"name": "key", "pattern": r".+", "description": "a path such as "
                       "cpu_info:features"}]),
        v("aggregate_instance_extra_specs:{key}", "Aggregate metadata the host's aggregates "
          "must carry (AggregateInstanceExtraSpecsFilter), with the operator grammar.",
          {"type": str, "grammar": True},
          parameters=[{"name": "key", "pattern": r".+", "description": "a metadata key"}]),
    ]


# ----------------------------------------------------------------------------- plugins
class EntryPointLike(Protocol):
    """What :func:`plugin_validators` needs of an entry point (for tests: any object)."""

    name: str
    value: str

    def load(self) -> Any:
        """The module the entry point names."""


def _coerce(item: Any, origin: str) -> ExtraSpecValidator:
    if isinstance(item, ExtraSpecValidator):
        return item
    if isinstance(item, Mapping):
        fields = dict(item)
    else:
        # A Nova-style validator object: read its attributes.
        fields = {k: getattr(item, k) for k in ("name", "description", "value", "parameters",
                                                "deprecated") if hasattr(item, k)}
    if "name" not in fields or "description" not in fields:
        raise ConfigError(f"{origin}: {item!r} is not an extra spec validator (needs a name "
                          "and a description)")
    fields["parameters"] = list(fields.get("parameters") or [])
    fields.setdefault("value", {"type": str})
    try:
        return ExtraSpecValidator(**fields)
    except TypeError as exc:
        raise ConfigError(f"{origin}: bad validator {item!r}: {exc}") from exc


def plugin_validators(entry_points: Iterable[EntryPointLike] | None = None) -> list[ExtraSpecValidator]:
    """Validators registered by plugin modules (``register()`` returning a list).

    ``entry_points`` defaults to the installed ``berth.extra_spec_validators`` and
    ``nova.api.extra_spec_validators`` entry points. A module that fails to load, lacks
    ``register()`` or returns something else is a :class:`ConfigError` naming it.
    """
    if entry_points is None:
        entry_points = [*metadata.entry_points(group=ENTRY_POINT_GROUP),
                        *metadata.entry_points(group=NOVA_ENTRY_POINT_GROUP)]
    found: list[ExtraSpecValidator] = []
    for ep in entry_points:
        origin = f"extra spec validator entry point {ep.name!r} ({ep.value})"
        try:
            module = ep.load()
        except Exception as exc:  # a broken third-party package must name itself
            raise ConfigError(f"{origin} failed to load: {exc}") from exc
        register: Callable[[], Any] | None = getattr(module, "register", None)
        if not callable(register):
            raise ConfigError(f"{origin}: the module has no register() function")
        items = register()
        if not isinstance(items, (list, tuple)):
            raise ConfigError(f"{origin}: register() returned {type(items).__name__}, not a list")
        found.extend(_coerce(item, origin) for item in items)
    return found


# ----------------------------------------------------------------------------- registry
class ValidatorRegistry:
    """Validators by name, with lookup of templated names and known namespaces."""

    def __init__(self, validators: Iterable[ExtraSpecValidator]) -> None:
        self.exact: dict[str, ExtraSpecValidator] = {}
        self.templates: list[ExtraSpecValidator] = []
        for validator in validators:
            if validator.name in self.exact or any(t.name == validator.name for t in self.templates):
                raise ConfigError(f"extra spec validator {validator.name!r} is registered twice")
            if validator.is_template:
                self.templates.append(validator)
            else:
                self.exact[validator.name] = validator
        self._namespaces = [
            v.namespace_regex for v in [*self.exact.values(), *self.templates]
            if v.namespace_regex is not None
        ]

    def __iter__(self) -> Any:
        return iter([*self.exact.values(), *self.templates])

    def __len__(self) -> int:
        return len(self.exact) + len(self.templates)

    def find(self, key: str) -> ExtraSpecValidator | None:
        """The validator of ``key``, or None."""
        validator = self.exact.get(key)
        if validator is not None:
            return validator
        for template in self.templates:
            if template.matches(key):
                return template
        return None

    def namespace_known(self, key: str) -> bool:
        """True if ``key`` has a namespace some validator uses (``hw:...``)."""
        namespace, sep, _ = key.partition(":")
        return bool(sep) and any(rx.fullmatch(namespace) for rx in self._namespaces)

    def problems(self, key: str, value: Any) -> list[str]:
        """Problems of one extra spec (empty when it is fine)."""
        if not isinstance(key, str):
            return [f"{key!r}: extra spec keys must be strings"]
        validator = self.find(key)
        if validator is not None:
            problem = validator.problem(key, value)
            return [problem] if problem else []
        if self.namespace_known(key):
            return [f"{key}: not a known extra spec in namespace "
                    f"{key.partition(':')[0]!r}{self._hint(key)}"]
        if not isinstance(value, str):
            return [f"{key}={value!r}: extra spec values must be strings"]
        if ":" not in key:
            problem = grammar_problem(key, value)
            return [problem] if problem else []
        return []

    def _hint(self, key: str) -> str:
        namespace = key.partition(":")[0]
        close = difflib.get_close_matches(key, list(self.exact), n=1)
        if close:
            return f" (did you mean {close[0]}?)"
        shapes = [t for t in self.templates
                  if t.namespace_regex is not None and t.namespace_regex.fullmatch(namespace)]
        if shapes:
            described = "; ".join(
                f"{t.name} where " + ", ".join(f"{p['name']} is {p.get('description', p['pattern'])}"
                                               for p in t.parameters)
                for t in shapes
            )
            return f" (expected {described})"
        return ""

    def uses_grammar(self, key: str) -> bool:
        """True when filters match ``key``'s value with the operator grammar: keys
        without a namespace, and validators declaring ``grammar``."""
        if ":" not in key:
            return True
        validator = self.find(key)
        return validator is not None and bool(validator.value.get("grammar"))

    def warnings(self, extra_specs: Mapping[str, Any]) -> list[str]:
        """Values that are valid but probably not what was meant: an operator the
        grammar does not see (``>=24``), so the value is compared as a string."""
        found: list[str] = []
        for key, value in extra_specs.items():
            if isinstance(key, str) and isinstance(value, str) and self.uses_grammar(key):
                problem = operator_lookalike(value)
                if problem is not None:
                    found.append(f"{key}={value!r}: {problem}")
        return found

    def check_flavor(self, extra_specs: Mapping[str, Any]) -> list[str]:
        """One problem per bad key or value, in key order."""
        problems: list[str] = []
        for key, value in extra_specs.items():
            problems.extend(self.problems(key, value))
        return problems


@functools.lru_cache(maxsize=1)
def default_registry() -> ValidatorRegistry:
    """Built-in validators plus those of installed plugins (loaded once)."""
    return ValidatorRegistry([*builtin_validators(), *plugin_validators()])


def check_flavor(
    extra_specs: Mapping[str, Any], registry: ValidatorRegistry | None = None
) -> list[str]:
    """Problems of a flavor's extra specs, one clear sentence per bad key or value.

    An empty list means the flavor is fine. ``registry`` defaults to
    :func:`default_registry` (built-ins and installed plugins).
    """
    return (registry or default_registry()).check_flavor(extra_specs)


def flavor_warnings(
    extra_specs: Mapping[str, Any], registry: ValidatorRegistry | None = None
) -> list[str]:
    """Warnings about a flavor's extra specs that are valid but likely mistyped
    (:meth:`ValidatorRegistry.warnings`)."""
    return (registry or default_registry()).warnings(extra_specs)
