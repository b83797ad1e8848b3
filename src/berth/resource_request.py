"""The placement query of a request: Nova's ``ResourceRequest`` (reference §8.5).

Pure functions from a :class:`~berth.model.request.RequestSpec` (and the configuration)
to the ``GET /allocation_candidates`` querystring:

* flavor extra specs ``resources[$S]:RC=N`` / ``trait[$S]:T=required|forbidden`` and
  ``group_policy`` (bad values are ignored with a warning, as in Nova); image
  ``traits_required``;
* CPU pinning translation (``dedicated``/``mixed`` -> PCPU, emulator threads ``isolate``
  -> +1 PCPU, thread policy -> ``HW_CPU_HYPERTHREADING`` required/forbidden), with the
  policies read by the NUMA code's :func:`~berth.hardware.numa.cpu_constraints`, and the
  other image/flavor translations to traits;
* the flavor basics (VCPU, MEMORY_MB, DISK_GB) when the extra specs did not name them,
  then ``hw:pmem`` labels as ``CUSTOM_PMEM_NAMESPACE_<LABEL>`` amounts;
* external groups (``spec.requested_resources``), zero stripping;
* the destination (``member_of``, ``in_tree``, the result ``limit``) and request-level
  parameters (``root_required``, ``same_subtree``).

:func:`resources_from_request_spec` is the entry point; :meth:`ResourceRequest.to_querystring`
renders the sorted, urlencoded query. Nothing here talks to a database: the lookup of
a requested host/node is a callable the caller passes in.
"""

from __future__ import annotations

import logging
import math
import re
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import os_resource_classes
import os_traits

from berth.config import SchedulerConfig
from berth.errors import ExtraSpecError, ImagePropertyError, InputError, NoValidHost
from berth.hardware.numa import (
    DEDICATED,
    EMULATOR_ISOLATE,
    ISOLATE,
    MIXED,
    REQUIRE,
    cpu_constraints,
    vpmem_labels,
)
from berth.model.request import Destination, RequestSpec

LOG = logging.getLogger(__name__)

#: Flavor extra-spec keys that feed placement: prefix, optional suffix, then the name.
EXTRA_SPEC_RE = re.compile(r"^(resources|trait)([a-zA-Z0-9_-]{1,64})?:(.*)$")
#: Hints that make the scheduler look at every candidate (no ``limit``).
UNLIMITED_HINTS = ("group", "same_host", "different_host")

STANDARD_RESOURCE_CLASSES: frozenset[str] = frozenset(os_resource_classes.STANDARDS)
STANDARD_TRAITS: frozenset[str] = frozenset(os_traits.get_traits())

PCPU = "PCPU"
VCPU = "VCPU"
HYPERTHREADING = "HW_CPU_HYPERTHREADING"


#: What placement accepts as a custom resource class name.
CUSTOM_RESOURCE_CLASS_RE = re.compile(r"CUSTOM_[A-Z0-9_]+")
#: The ``group_policy`` values placement knows.
GROUP_POLICIES = ("none", "isolate")


def trait_exists(name: str) -> bool:
    """Whether os-traits knows ``name`` (custom traits are not looked up here)."""
    return name in STANDARD_TRAITS


@dataclass
class RequestGroup:
    """One request group: resources (and traits, aggregates, tree) one provider set holds.

    ``requester_id`` is the suffix ("" for the unsuffixed group). ``use_same_provider``
    is False only for the unsuffixed group. ``aggregates`` is a list of OR groups, ANDed
    together. ``provider_uuids`` is filled by the scheduler from the claimed mapping.
    """

    requester_id: str = ""
    use_same_provider: bool = True
    resources: dict[str, int] = field(default_factory=dict)
    required_traits: set[str] = field(default_factory=set)
    forbidden_traits: set[str] = field(default_factory=set)
    aggregates: list[list[str]] = field(default_factory=list)
    forbidden_aggregates: set[str] = field(default_factory=set)
    in_tree: str | None = None
    provider_uuids: list[str] = field(default_factory=list)

    @property
    def suffix(self) -> str:
        """The querystring suffix of this group."""
        return self.requester_id or ""

    def is_empty(self) -> bool:
        """Nothing to ask: no resources, traits or aggregates (Nova's ``is_empty``, which
        does not look at ``in_tree``: a group with only that is dropped too)."""
        return not (self.resources or self.required_traits or self.forbidden_traits
                    or self.aggregates or self.forbidden_aggregates)

    def to_queryparams(self) -> list[tuple[str, str]]:
        """This group's ``resources$S``, ``required$S``, ``member_of$S``, ``in_tree$S``.

        ``resources$S`` is always sent, as Nova sends it: a group of traits alone (say a
        flavor's ``trait1:CUSTOM_X=required`` without ``resources1:``) asks for
        ``resources1=`` empty, which Placement refuses, so Nova finds no host for it."""
        s = self.suffix
        params: list[tuple[str, str]] = [(f"resources{s}", ",".join(
            f"{rc}:{amount}" for rc, amount in sorted(self.resources.items())))]
        traits = sorted(self.required_traits) + sorted(f"!{t}" for t in self.forbidden_traits)
        if traits:
            params.append((f"required{s}", ",".join(traits)))
        for agg_list in self.aggregates:
            params.append((f"member_of{s}", "in:" + ",".join(agg_list)))
        if self.forbidden_aggregates:
            params.append((f"member_of{s}", "!in:" + ",".join(sorted(self.forbidden_aggregates))))
        if self.in_tree:
            params.append((f"in_tree{s}", self.in_tree))
        return params


@dataclass
class RequestLevelParams:
    """Request-wide constraints: traits on the root provider, suffixes sharing a subtree."""

    root_required: set[str] = field(default_factory=set)
    root_forbidden: set[str] = field(default_factory=set)
    same_subtree: list[list[str]] = field(default_factory=list)


def request_level_params(spec: RequestSpec) -> RequestLevelParams:
    """The spec's request-level params, created (and attached) when absent."""
    params = spec.request_level_params
    if params is None:
        params = spec.request_level_params = RequestLevelParams()
    return params  # type: ignore[no-any-return]


@dataclass
class ResourceRequest:
    """Every request group plus the request-wide query parameters."""

    groups: dict[str, RequestGroup] = field(default_factory=dict)
    group_policy: str | None = None
    limit: int | None = None
    root_required: set[str] = field(default_factory=set)
    root_forbidden: set[str] = field(default_factory=set)
    same_subtree: list[list[str]] = field(default_factory=list)
    cpu_pinning_requested: bool = False
    #: Suffixes every ``resources``/``trait`` extra spec named, valid or not, kept or
    #: stripped later (Nova counts the flavor's groups as they stand after the extra specs).
    flavor_suffixes: set[str] = field(default_factory=set)

    def group(self, suffix: str = "") -> RequestGroup:
        """The group with ``suffix``, created on first use."""
        grp = self.groups.get(suffix)
        if grp is None:
            grp = self.groups[suffix] = RequestGroup(requester_id=suffix,
                                                     use_same_provider=bool(suffix))
        return grp

    @property
    def unsuffixed(self) -> RequestGroup:
        """The unsuffixed group (always present)."""
        return self.group("")

    def merged_resources(self) -> dict[str, int]:
        """Amounts per class summed over every group (zeros included)."""
        merged: dict[str, int] = {}
        for grp in self.groups.values():
            for rc, amount in grp.resources.items():
                merged[rc] = merged.get(rc, 0) + amount
        return merged

    def strip_zeros(self) -> None:
        """Drop zero amounts, then suffixed groups left with nothing."""
        for grp in self.groups.values():
            grp.resources = {rc: n for rc, n in grp.resources.items() if n}
        for suffix in [s for s, g in self.groups.items() if s and g.is_empty()]:
            del self.groups[suffix]

    def to_queryparams(self) -> list[tuple[str, str]]:
        """The query parameters, sorted as Nova sorts them."""
        params: list[tuple[str, str]] = []
        if self.limit is not None:
            params.append(("limit", str(self.limit)))
        if self.group_policy is not None:
            params.append(("group_policy", self.group_policy))
        root = sorted(self.root_required) + sorted(f"!{t}" for t in self.root_forbidden)
        if root:
            params.append(("root_required", ",".join(root)))
        for subtree in self.same_subtree:
            params.append(("same_subtree", ",".join(sorted(subtree))))
        for grp in self.groups.values():
            # Nova's strip_zeros drops every empty group, the unsuffixed one included.
            if not grp.is_empty():
                params.extend(grp.to_queryparams())
        return sorted(params)

    def to_querystring(self) -> str:
        """``GET /allocation_candidates?<this>``: sorted and urlencoded."""
        return urllib.parse.urlencode(self.to_queryparams())


# --------------------------------------------------------------------------- extra specs
def _resource_class(key: str, name: str) -> str | None:
    """``name`` if a ``resources`` key may ask for it, None (with a warning) if Nova
    ignores it; a malformed ``CUSTOM_`` name raises ExtraSpecError.

    Nova only checks ``startswith("CUSTOM_")`` and sends ``CUSTOM_foo`` on to placement,
    which answers 400, so the request ends in a bare NoValidHost. Berth rejects it here
    instead, naming the key (docs/architecture.md, deliberate deviations).
    """
    if name.startswith("CUSTOM_"):
        if not CUSTOM_RESOURCE_CLASS_RE.fullmatch(name):
            raise ExtraSpecError(f"{key}: {name!r} is not a valid custom resource class "
                                 "(CUSTOM_ followed by A-Z, 0-9 or _)", key=key)
        return name
    if name in STANDARD_RESOURCE_CLASSES:
        return name
    LOG.warning("ignoring flavor extra spec %s: %r is not a standard or CUSTOM_ resource "
                "class", key, name)
    return None


def _process_extra_specs(req: ResourceRequest, extra_specs: Mapping[str, str]) -> None:
    for key, value in extra_specs.items():
        if key == "group_policy":
            if value in GROUP_POLICIES:
                req.group_policy = value
            else:
                LOG.warning("ignoring flavor extra spec group_policy=%r: expected none or "
                            "isolate", value)
            continue
        match = EXTRA_SPEC_RE.match(key)
        if not match:
            continue
        prefix, suffix, name = match.group(1), match.group(2) or "", match.group(3)
        req.flavor_suffixes.add(suffix)
        if prefix == "resources":
            rc = _resource_class(key, name)
            if rc is None:
                continue
            try:
                amount = int(value)
            except (TypeError, ValueError):
                amount = -1
            if amount < 0:
                LOG.warning("ignoring flavor extra spec %s=%r: the amount must be a "
                            "non-negative integer", key, value)
                continue
            req.group(suffix).resources[rc] = amount
        else:
            if value == "required":
                req.group(suffix).required_traits.add(name)
            elif value == "forbidden":
                req.group(suffix).forbidden_traits.add(name)
            else:
                LOG.warning("ignoring flavor extra spec %s=%r: expected required or "
                            "forbidden", key, value)


def _process_image(req: ResourceRequest, spec: RequestSpec) -> None:
    if spec.image is None:
        return
    for trait in spec.image.properties.get("traits_required") or []:
        req.unsuffixed.required_traits.add(str(trait))


# --------------------------------------------------------------------------- pinning
def _spec_value(spec: RequestSpec, flavor_key: str, image_key: str) -> Any:
    """A flavor extra spec, else the image property (flavor wins, as Nova resolves)."""
    value = spec.flavor.extra_specs.get(flavor_key)
    if value is not None:
        return value
    if spec.image is not None:
        return spec.image.properties.get(image_key)
    return None


def _translate_pinning(req: ResourceRequest, spec: RequestSpec) -> None:
    """``dedicated``: PCPU for every vCPU; ``mixed``: PCPU for the dedicated mask (else the
    realtime vCPUs) and VCPU for the rest; +1 PCPU for isolated emulator threads (a
    flavor-only policy); the thread policy as the hyperthreading trait.

    The policies are read by the NUMA code's :func:`~berth.hardware.numa.cpu_constraints`,
    so the query and the guest topology never disagree. Only ``dedicated`` counts as
    pinning requested (the PCPU-less fallback query is for it alone, as in Nova).
    """
    props = spec.image.properties if spec.image is not None else None
    cpu = cpu_constraints(spec.flavor, props)
    group = req.unsuffixed
    vcpus = spec.flavor.vcpus
    if cpu.policy in (DEDICATED, MIXED):
        if cpu.policy == DEDICATED:
            pcpus = vcpus
            req.cpu_pinning_requested = True
        else:
            pcpus = len(cpu.mixed_dedicated())
            group.resources[VCPU] = vcpus - pcpus
        if cpu.emulator_policy == EMULATOR_ISOLATE:
            pcpus += 1
        group.resources[PCPU] = pcpus
    if cpu.thread_policy == ISOLATE:
        group.forbidden_traits.add(HYPERTHREADING)
    elif cpu.thread_policy == REQUIRE:
        group.required_traits.add(HYPERTHREADING)


# --------------------------------------------------------------------------- other traits
def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes", "on", "y", "t")


#: Image/flavor values that translate to a required root trait.
_TPM_VERSION = {"1.2": "COMPUTE_SECURITY_TPM_1_2", "2.0": "COMPUTE_SECURITY_TPM_2_0"}
_TPM_MODEL = {"tpm-tis": "COMPUTE_SECURITY_TPM_TIS", "tpm-crb": "COMPUTE_SECURITY_TPM_CRB"}
_MEM_ENC_MODEL = {"amd-sev": "HW_CPU_X86_AMD_SEV", "amd-sev-es": "HW_CPU_X86_AMD_SEV_ES",
                  "amd-sev-snp": "HW_CPU_X86_AMD_SEV_SNP", "intel-tdx": "HW_CPU_X86_INTEL_TDX"}


#: Memory encryption models that need stateless firmware (Nova's needs_stateless_firmware).
_STATELESS_MEM_ENC = ("amd-sev-snp", "intel-tdx")


def _mem_encryption(spec: RequestSpec) -> str | None:
    """Nova's ``get_mem_encryption_constraint`` as its API and its ResourceRequest call
    it: the memory encryption model when the flavor or the image asks for encryption
    (None otherwise), after the checks Nova makes, each refused as Nova refuses it: the
    two asking for different things, an image not booting UEFI, a machine type that is
    not q35, a model needing stateless firmware without it, TDX with a video device."""
    flavor_text = spec.flavor.extra_specs.get("hw:mem_encryption")
    props = spec.image.properties if spec.image is not None else None
    image_value = props.get("hw_mem_encryption") if props is not None else None
    flavor_value = None if flavor_text is None else _truthy(flavor_text)
    if not flavor_value and not image_value:
        return None
    if flavor_value is not None and image_value is not None and flavor_value != bool(image_value):
        _refuse(image_value, "hw_mem_encryption", f"the flavor's hw:mem_encryption is "
                f"{flavor_text!r}; the flavor and the image conflict")
    model = str(unique_flavor_image_value(spec, "mem_encryption_model")[0] or "amd-sev")
    requesters = ([f"hw:mem_encryption extra spec in {spec.flavor.name} flavor"]
                  if flavor_value else [])
    if image_value:
        image_id = spec.image.id if spec.image is not None and spec.image.id else "<no-id>"
        requesters.append(f"hw_mem_encryption property of image {image_id}")
    get = props.get if props is not None else (lambda _key, _default=None: None)
    if get("hw_firmware_type") != "uefi":
        _refuse(get("hw_firmware_type"), "hw_firmware_type", "memory encryption is "
                f"requested by {' and '.join(requesters)}: the image must set 'uefi'")
    machine = get("hw_machine_type")
    if machine is not None and "q35" not in str(machine):
        _refuse(machine, "hw_machine_type", f"q35 type is required for {model} to work")
    if model in _STATELESS_MEM_ENC and not get("hw_firmware_stateless"):
        _refuse(get("hw_firmware_stateless"), "hw_firmware_stateless", f"the {model} memory "
                "encryption model requires stateless firmware (True)")
    if model == "intel-tdx" and get("hw_video_model") != "none":
        _refuse(get("hw_video_model"), "hw_video_model", "the intel-tdx memory encryption "
                "model is incompatible with an attached video device: set it to 'none'")
    return model


def mem_encryption_requested(spec: RequestSpec) -> bool:
    """Whether the flavor or the image asks for encrypted memory (Nova's
    ``get_mem_encryption_constraint``; its refusals as :func:`_mem_encryption`'s)."""
    return _mem_encryption(spec) is not None


def vtpm_version(spec: RequestSpec) -> str | None:
    """The vTPM version the flavor or the image asks for, or None (Nova's
    ``get_vtpm_constraint`` asks nothing else to decide there is one)."""
    version, _ = unique_flavor_image_value(spec, "tpm_version")
    return None if version is None else str(version)


def unique_flavor_image_value(spec: RequestSpec, key: str, prefix: str = "hw") -> tuple[Any, str]:
    """Nova's ``_get_unique_flavor_image_meta``: the flavor's ``{prefix}:{key}`` or the
    image's ``{prefix}_{key}``, and which of the two names it came from. Both set and
    different is Nova's FlavorImageConflict: an ImagePropertyError naming the property."""
    flavor_key, image_key = f"{prefix}:{key}", f"{prefix}_{key}"
    flavor_value = spec.flavor.extra_specs.get(flavor_key)
    image_value = spec.image.properties.get(image_key) if spec.image is not None else None
    if image_value and flavor_value and str(image_value) != str(flavor_value):
        raise ImagePropertyError(
            image_key, image_value,
            f"conflicts with the flavor's {flavor_key} {flavor_value!r} (both set, and they "
            "differ: Nova's FlavorImageConflict)")
    if flavor_value:
        return flavor_value, flavor_key
    return image_value, image_key


def allowed_value(value: Any, name: str, allowed: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``allowed``; else Nova's ``Invalid``, as the error of
    the flavor key or image property ``name`` it came from."""
    if str(value) in allowed:
        return str(value)
    _refuse(value, name, f"invalid {what}; allowed values: {', '.join(allowed)}")


def _refuse(value: Any, name: str, problem: str) -> NoReturn:
    """Nova's ``Invalid`` for ``value`` of the flavor key (``hw:x``) or image property
    (``hw_x``) ``name``: an ExtraSpecError or an ImagePropertyError naming it."""
    if ":" in name:
        raise ExtraSpecError(f"{name}={value!r}: {problem}", key=name)
    raise ImagePropertyError(name, value, problem)


def _translate_other(req: ResourceRequest, spec: RequestSpec) -> None:
    """Memory encryption, vTPM, secure boot, maxphysaddr, stateless firmware, socket
    PCI NUMA affinity: each adds a required trait (memory encryption also a resource).
    The flavor and the image may each set a value, as in Nova; where Nova refuses two
    different ones (and values it does not know), so does Berth."""
    group = req.unsuffixed
    model = _mem_encryption(spec)
    if model is not None:
        group.resources["MEM_ENCRYPTION_CONTEXT"] = 1
        trait = _MEM_ENC_MODEL.get(model)
        if trait:
            group.required_traits.add(trait)
    version, where = unique_flavor_image_value(spec, "tpm_version")
    if version is not None:
        version = allowed_value(version, where, tuple(_TPM_VERSION), "TPM version")
        model, where = unique_flavor_image_value(spec, "tpm_model")
        model = "tpm-tis" if model is None else allowed_value(model, where, tuple(_TPM_MODEL),
                                                        "TPM model")
        if model == "tpm-crb" and version != "2.0":
            _refuse(model, where, "TPM model CRB is only valid with TPM version 2.0")
        group.required_traits.add(_TPM_VERSION[version])
        group.required_traits.add(_TPM_MODEL[model])
    secure_boot, where = unique_flavor_image_value(spec, "secure_boot", prefix="os")
    if secure_boot is not None and allowed_value(
            secure_boot, where, ("required", "disabled", "optional"),
            "secure boot policy") == "required":
        group.required_traits.add("COMPUTE_SECURITY_UEFI_SECURE_BOOT")
    mode, where = unique_flavor_image_value(spec, "maxphysaddr_mode")
    if mode is not None:
        mode = allowed_value(mode, where, ("passthrough", "emulate"), "maxphysaddr mode")
        group.required_traits.add("COMPUTE_ADDRESS_SPACE_PASSTHROUGH" if mode == "passthrough"
                                  else "COMPUTE_ADDRESS_SPACE_EMULATED")
    # Nova ignores (with a warning) stateless firmware on an image not booting UEFI.
    props = spec.image.properties if spec.image is not None else None
    if (props is not None and props.get("hw_firmware_type") == "uefi"
            and _truthy(props.get("hw_firmware_stateless", False))):
        group.required_traits.add("COMPUTE_SECURITY_STATELESS_FIRMWARE")
    flavor_policy = spec.flavor.extra_specs.get("hw:pci_numa_affinity_policy")
    image_policy = props.get("hw_pci_numa_affinity_policy") if props is not None else None
    if flavor_policy and image_policy and flavor_policy != image_policy:
        raise ImagePropertyError("hw_pci_numa_affinity_policy", image_policy,
                                 "differs from the flavor's hw:pci_numa_affinity_policy "
                                 f"{flavor_policy!r} (Nova's ImagePCINUMAPolicyForbidden)")
    policy = flavor_policy or image_policy
    where = "hw:pci_numa_affinity_policy" if flavor_policy else "hw_pci_numa_affinity_policy"
    if policy and allowed_value(policy, where, ("required", "legacy", "preferred", "socket"),
                                "PCI NUMA affinity policy") == "socket":
        group.required_traits.add("COMPUTE_SOCKET_PCI_NUMA_AFFINITY")


def _translate_vpmems(req: ResourceRequest, spec: RequestSpec) -> None:
    """``hw:pmem`` labels: ``CUSTOM_PMEM_NAMESPACE_<LABEL>`` = how many labels name that
    class once normalized (``small`` and ``SMALL`` are one class, counted twice), in the
    unsuffixed group, replacing any amount the extra specs gave that class."""
    counts: Counter[str] = Counter(
        os_resource_classes.normalize_name(f"PMEM_NAMESPACE_{label}")
        for label in vpmem_labels(spec.flavor.extra_specs))
    for rc, count in counts.items():
        req.unsuffixed.resources[rc] = count


def _external_groups(req: ResourceRequest, spec: RequestSpec) -> None:
    """``spec.requested_resources`` (ports, devices), each its own group suffixed with its
    ``requester_id``. Nova refuses a group without one, or with one already in use; so
    does Berth, with an InputError, rather than merging it into another group."""
    for ext in spec.requested_resources or []:
        suffix = str(getattr(ext, "requester_id", "") or "")
        if not suffix:
            raise InputError("requested_resources: a request group has no requester_id")
        if suffix in req.groups:
            raise InputError(f"requested_resources: requester_id {suffix!r} is already the "
                             "suffix of another request group")
        grp = req.group(suffix)
        for rc, amount in (getattr(ext, "resources", None) or {}).items():
            grp.resources[rc] = int(amount)
        grp.required_traits |= set(getattr(ext, "required_traits", None) or ())
        grp.forbidden_traits |= set(getattr(ext, "forbidden_traits", None) or ())
        for agg in getattr(ext, "aggregates", None) or []:
            grp.aggregates.append(list(agg))
        grp.forbidden_aggregates |= set(getattr(ext, "forbidden_aggregates", None) or ())
        if getattr(ext, "in_tree", None):
            grp.in_tree = ext.in_tree


def flavor_disk_gb(spec: RequestSpec) -> int:
    """``ephemeral_gb + ceil(swap_mb / 1024) + root_gb`` (root left out when is_bfv)."""
    flavor = spec.flavor
    return (flavor.ephemeral_gb + math.ceil(flavor.swap / 1024)
            + (0 if spec.is_bfv else flavor.root_gb))


def from_request_spec(spec: RequestSpec, enable_pinning_translate: bool = True) -> ResourceRequest:
    """``ResourceRequest.from_request_spec``: the groups of a request (no destination)."""
    req = ResourceRequest()
    req.group("")
    _process_extra_specs(req, spec.flavor.extra_specs)
    _process_image(req, spec)
    if enable_pinning_translate:
        _translate_pinning(req, spec)
    _translate_other(req, spec)
    _external_groups(req, spec)
    # The flavor basics only when the extra specs (or pinning) did not name them.
    merged = req.merged_resources()
    if VCPU not in merged and PCPU not in merged:
        req.unsuffixed.resources[VCPU] = spec.flavor.vcpus
    if "MEMORY_MB" not in merged:
        req.unsuffixed.resources["MEMORY_MB"] = spec.flavor.memory_mb
    if "DISK_GB" not in merged:
        disk = flavor_disk_gb(spec)
        if disk:
            req.unsuffixed.resources["DISK_GB"] = disk
    _translate_vpmems(req, spec)
    req.strip_zeros()
    params = spec.request_level_params
    if params is not None:
        req.root_required |= set(getattr(params, "root_required", ()) or ())
        req.root_forbidden |= set(getattr(params, "root_forbidden", ()) or ())
        req.same_subtree = [list(s) for s in getattr(params, "same_subtree", ()) or ()]
    # Placement needs a group_policy with two or more suffixed groups. When at most one
    # of the flavor's came with them, the others came from outside (ports, devices) and
    # Nova defaults to "none"; otherwise the flavor should have said, and placement refuses.
    if req.group_policy is None and sum(1 for s in req.groups if s) >= 2:
        if sum(1 for s in req.flavor_suffixes if s) <= 1:
            req.group_policy = "none"
        else:
            LOG.warning("the flavor names several suffixed request groups but no "
                        "group_policy (none or isolate); placement will refuse the query")
    return req


# --------------------------------------------------------------------------- destination
@dataclass(frozen=True)
class NodeRef:
    """A compute node found by host/node name: its uuid (the root provider) and names."""

    uuid: str
    host: str
    nodename: str


#: ``find_nodes(host, node)``: the compute nodes matching a host and/or node name.
NodeLookup = Callable[[str | None, str | None], Sequence[NodeRef]]


def resources_from_request_spec(
    spec: RequestSpec,
    config: SchedulerConfig,
    find_nodes: NodeLookup,
    enable_pinning_translate: bool = True,
) -> ResourceRequest:
    """The whole placement query of ``spec`` (reference §8.5), destination included.

    May fill ``spec.requested_destination`` with the single node a forced/requested
    host resolves to. Raises NoValidHost("No such host - host: X node: Y") when the
    requested host/node does not exist.
    """
    req = from_request_spec(spec, enable_pinning_translate)
    req.limit = config.scheduler.max_placement_results
    dest = spec.requested_destination
    target_host = dest.host if dest else None
    target_node = dest.node if dest else None
    if dest is not None:
        for agg in dest.aggregates or []:
            req.unsuffixed.aggregates.append(agg.split(","))
        if dest.forbidden_aggregates:
            req.unsuffixed.forbidden_aggregates |= set(dest.forbidden_aggregates)
    if spec.force_hosts:
        target_host = target_host or spec.force_hosts[0]
    if spec.force_nodes:
        target_node = target_node or spec.force_nodes[0]
    if target_host or target_node:
        nodes = list(find_nodes(target_host, target_node))
        if not nodes:
            raise NoValidHost(f"No such host - host: {target_host} node: {target_node}")
        if len(nodes) == 1:
            if dest is not None:
                dest.host, dest.node = nodes[0].host, nodes[0].nodename
            else:
                spec.requested_destination = Destination(host=nodes[0].host,
                                                         node=nodes[0].nodename)
            req.unsuffixed.in_tree = nodes[0].uuid
        else:
            req.limit = None
    if spec.scheduler_hints and any(h in spec.scheduler_hints for h in UNLIMITED_HINTS):
        req.limit = None
    return req


def nodes_from_rows(rows: Iterable[tuple[str | None, str, str]]) -> NodeLookup:
    """A :data:`NodeLookup` over ``(uuid, host, nodename)`` triples (exact names)."""
    triples = [(u, h, n) for u, h, n in rows if u]

    def find(host: str | None, node: str | None) -> list[NodeRef]:
        return [NodeRef(str(u), h, n) for u, h, n in triples
                if (host is None or h == host) and (node is None or n == node)]

    return find
