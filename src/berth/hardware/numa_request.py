"""NUMA topologies: a request's flavor extra specs and image properties to the instance
topology it asks for, with Nova's precedence and conflicts (see :mod:`berth.hardware.numa`)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from berth.errors import ExtraSpecError, ImagePropertyError

if TYPE_CHECKING:
    pass

from berth.hardware.numa_model import (
    CPU_POLICIES,
    DEDICATED,
    EMULATOR_ISOLATE,
    EMULATOR_POLICIES,
    ISOLATE,
    MEMPAGES_ANY,
    MEMPAGES_LARGE,
    MEMPAGES_SMALL,
    MIXED,
    PINNING_POLICIES,
    PREFER,
    REQUIRE,
    SHARED,
    THREAD_POLICIES,
    InstanceNUMACell,
    InstanceNUMATopology,
    format_cpu_spec,
    parse_cpu_spec,
)

#: Page size words of ``hw:mem_page_size`` (Nova's constants).
_PAGESIZE_WORDS = {"small": MEMPAGES_SMALL, "large": MEMPAGES_LARGE, "any": MEMPAGES_ANY}
#: Byte multipliers of oslo's IEC units (``2MB`` and ``2MiB`` are both 2 * 1024**2 bytes).
_UNIT_BYTES = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}
_SIZE_RE = re.compile(r"^(\d*\.?\d+)([KMGT]i?)?(b|bit|B)$")



# -------------------------------------------------------------------------- request parsing
def _image_get(image_props: Any, name: str) -> Any:
    if image_props is None:
        return None
    getter = getattr(image_props, "get", None)
    return getter(name) if getter is not None else None


def _image_raw(image_props: Any) -> Mapping[str, Any]:
    raw = getattr(image_props, "raw", None)
    if isinstance(raw, Mapping):
        return raw
    return image_props if isinstance(image_props, Mapping) else {}


def _text(value: Any) -> str | None:
    if value is None:
        return None
    return str(value).strip()


def _bad(key: str, value: Any, problem: str) -> ExtraSpecError | ImagePropertyError:
    """The error of the request's side that ``key`` names: a flavor extra spec
    (``hw:...``, ``resources:...``, ``trait:...``) or an image property (``hw_...``)."""
    if ":" not in key:
        return ImagePropertyError(key, value, problem)
    return ExtraSpecError(f"{key}={value!r}: {problem}", key=key, value=value)


def _choice(key: str, value: str | None, allowed: Sequence[str]) -> str | None:
    if value is None or value == "":
        return None
    if value not in allowed:
        raise _bad(key, value, f"must be one of {', '.join(allowed)}")
    return value


def _cpu_policy(specs: Mapping[str, str], image_props: Any) -> str | None:
    flavor = _choice("hw:cpu_policy", _text(specs.get("hw:cpu_policy")), CPU_POLICIES)
    image = _choice("hw_cpu_policy", _text(_image_get(image_props, "hw_cpu_policy")), CPU_POLICIES)
    if flavor == DEDICATED:
        return flavor
    if flavor == MIXED:
        if image == DEDICATED:
            raise _bad("hw_cpu_policy", image, "the image may not ask for dedicated CPUs "
                       "when the flavor's hw:cpu_policy is mixed")
        return flavor
    if flavor == SHARED:
        if image in PINNING_POLICIES:
            raise _bad("hw_cpu_policy", image, "the image may not ask for pinned CPUs "
                       "when the flavor's hw:cpu_policy is shared")
        return flavor
    return image


def _thread_policy(specs: Mapping[str, str], image_props: Any) -> str | None:
    flavor = _choice("hw:cpu_thread_policy", _text(specs.get("hw:cpu_thread_policy")), THREAD_POLICIES)
    image = _choice("hw_cpu_thread_policy", _text(_image_get(image_props, "hw_cpu_thread_policy")),
                    THREAD_POLICIES)
    if flavor in (None, PREFER):
        return flavor or image
    if image and image != flavor:
        raise _bad("hw_cpu_thread_policy", image,
                   f"conflicts with the flavor's hw:cpu_thread_policy={flavor}")
    return flavor


def _emulator_policy(specs: Mapping[str, str]) -> str | None:
    # Nova reads the emulator threads policy from the flavor only.
    return _choice("hw:emulator_threads_policy", _text(specs.get("hw:emulator_threads_policy")),
                   EMULATOR_POLICIES)


_TRUE_WORDS = frozenset({"1", "t", "true", "on", "y", "yes"})
_RESOURCE_VCPU_RE = re.compile(r"resources([1-9][0-9]*)?:VCPU")
_RESOURCE_PCPU_RE = re.compile(r"resources([1-9][0-9]*)?:PCPU")
_HT_TRAIT_RE = re.compile(r"trait([1-9][0-9]*)?:HW_CPU_HYPERTHREADING")


def _explicit_cpu_resources(specs: Mapping[str, str]) -> tuple[int, int]:
    """``resources[N]:VCPU`` and ``resources[N]:PCPU`` totals (non-numbers are ignored
    here, as Nova leaves them to the placement request parser)."""
    vcpu = pcpu = 0
    for key, value in specs.items():
        for pattern, is_pcpu in ((_RESOURCE_VCPU_RE, False), (_RESOURCE_PCPU_RE, True)):
            if pattern.match(key):
                try:
                    amount = int(value)
                except (TypeError, ValueError):
                    continue
                if is_pcpu:
                    pcpu += amount
                else:
                    vcpu += amount
    return vcpu, pcpu


def _hyperthreading_trait(specs: Mapping[str, str], image_props: Any) -> str | None:
    for key, value in specs.items():
        if _HT_TRAIT_RE.match(key):
            return value
    required = _image_get(image_props, "traits_required") or []
    if "HW_CPU_HYPERTHREADING" in required:
        return "required"
    return None


def _realtime_cpus(specs: Mapping[str, str], image_props: Any, vcpus: int,
                   emulator_policy: str | None) -> set[int] | None:
    if str(specs.get("hw:cpu_realtime", "")).strip().lower() not in _TRUE_WORDS:
        return None
    image_mask = _text(_image_get(image_props, "hw_cpu_realtime_mask"))
    flavor_mask = _text(specs.get("hw:cpu_realtime_mask"))
    # The image's mask is more specific and wins.
    key, mask = ("hw_cpu_realtime_mask", image_mask) if image_mask else (
        "hw:cpu_realtime_mask", flavor_mask)
    everything = set(range(vcpus))
    if mask:
        try:
            rt = parse_cpu_spec(f"0-{vcpus - 1},{mask}" if mask.startswith("^") else mask)
        except ValueError as exc:
            raise _bad(key, mask, str(exc)) from None
    else:
        rt = set(everything)
    if not rt:
        raise _bad(key, mask, "the realtime mask leaves no realtime vCPU")
    if rt == everything and not emulator_policy:
        raise _bad(key, mask, "every vCPU is realtime: leave one out or set "
                   "hw:emulator_threads_policy")
    if not rt <= everything:
        raise _bad(key, mask, f"vCPUs {format_cpu_spec(rt - everything)} are outside the "
                   f"flavor's {vcpus} vCPUs")
    return rt


def _parse_pagesize(key: str, value: str) -> int:
    """Nova's page size forms: ``small``/``large``/``any``, KiB digits, or a size with an
    IEC unit as oslo parses it (``2MB``, ``1GiB``; ``b``/``bit`` count bits)."""
    if value in _PAGESIZE_WORDS:
        return _PAGESIZE_WORDS[value]
    if value.isdigit():
        size_kb = float(int(value))
    else:
        m = _SIZE_RE.match(value)
        if not m:
            raise _bad(key, value, "expected small, large, any, a size in KiB or a size "
                       "with a unit such as 2MB or 1GiB")
        size_bytes = float(m.group(1)) * _UNIT_BYTES[(m.group(2) or "")[:1]]
        if m.group(3) != "B":
            size_bytes /= 8
        size_kb = float(math.ceil(size_bytes)) / 1024
    if size_kb <= 0 or not size_kb.is_integer():
        raise _bad(key, value, "page size must be a positive whole number of KiB")
    return int(size_kb)


def _pagesize(specs: Mapping[str, str], image_props: Any) -> int | None:
    flavor = _text(specs.get("hw:mem_page_size")) or None
    image = _text(_image_get(image_props, "hw_mem_page_size")) or None
    if not flavor:
        if image:
            raise _bad("hw_mem_page_size", image,
                       "the image may set a page size only when the flavor's "
                       "hw:mem_page_size is large or any")
        return None
    size = _parse_pagesize("hw:mem_page_size", flavor)
    if image:
        if size in (MEMPAGES_ANY, MEMPAGES_LARGE):
            return _parse_pagesize("hw_mem_page_size", image)
        raise _bad("hw_mem_page_size", image,
                   f"forbidden with the flavor's hw:mem_page_size={flavor}")
    return size


def _numa_nodes(specs: Mapping[str, str], image_props: Any) -> int | None:
    flavor = _text(specs.get("hw:numa_nodes")) or None
    image_value = _image_get(image_props, "hw_numa_nodes")
    image = _text(image_value) or None
    if flavor and image:
        raise _bad("hw_numa_nodes", image, "the image may not set hw_numa_nodes when the "
                   "flavor sets hw:numa_nodes")
    key = "hw:numa_nodes" if flavor else "hw_numa_nodes"
    value = flavor or image
    if value is None:
        return None
    try:
        nodes = int(value)
    except ValueError:
        raise _bad(key, value, "must be an integer >= 1") from None
    if nodes < 1:
        raise _bad(key, value, "must be an integer >= 1")
    return nodes


def _flavor_node_list(specs: Mapping[str, str], prop: str) -> list[str] | None:
    values: list[str] = []
    while f"hw:numa_{prop}.{len(values)}" in specs:
        values.append(specs[f"hw:numa_{prop}.{len(values)}"])
    return values or None


def _image_node_list(image_props: Any, prop: str) -> list[Any] | None:
    whole = _image_get(image_props, f"hw_numa_{prop}")
    if isinstance(whole, (list, tuple)) and whole:
        return list(whole)
    raw = _image_raw(image_props)
    values: list[Any] = []
    while f"hw_numa_{prop}.{len(values)}" in raw:
        values.append(raw[f"hw_numa_{prop}.{len(values)}"])
    return values or None


def _node_cpus(specs: Mapping[str, str], image_props: Any) -> list[set[int]] | None:
    flavor = _flavor_node_list(specs, "cpus")
    image = _image_node_list(image_props, "cpus")
    if flavor is not None and image is not None:
        raise _bad("hw_numa_cpus.0", image[0], "the image may not set hw_numa_cpus.N when "
                   "the flavor sets hw:numa_cpus.N")
    values, prefix = (flavor, "hw:numa_cpus") if flavor is not None else (image, "hw_numa_cpus")
    if values is None:
        return None
    out = []
    for i, value in enumerate(values):
        if isinstance(value, (set, frozenset, list, tuple)):
            out.append({int(v) for v in value})
            continue
        try:
            out.append(parse_cpu_spec(str(value)))
        except ValueError as exc:
            raise _bad(f"{prefix}.{i}", value, str(exc)) from None
    return out


def _node_mem(specs: Mapping[str, str], image_props: Any) -> list[int] | None:
    flavor = _flavor_node_list(specs, "mem")
    image = _image_node_list(image_props, "mem")
    if flavor is not None and image is not None:
        raise _bad("hw_numa_mem.0", image[0], "the image may not set hw_numa_mem.N when the "
                   "flavor sets hw:numa_mem.N")
    values, prefix = (flavor, "hw:numa_mem") if flavor is not None else (image, "hw_numa_mem")
    if values is None:
        return None
    out = []
    for i, value in enumerate(values):
        try:
            mem = int(str(value).strip())
        except ValueError:
            raise _bad(f"{prefix}.{i}", value, "must be an integer number of MB") from None
        if mem < 0:
            raise _bad(f"{prefix}.{i}", value, "must be >= 0")
        out.append(mem)
    return out


def _dedicated_mask(specs: Mapping[str, str], vcpus: int) -> set[int] | None:
    mask = _text(specs.get("hw:cpu_dedicated_mask"))
    if not mask:
        return None
    try:
        if mask.startswith("^"):
            pcpus = parse_cpu_spec(f"0-{vcpus - 1},{mask}") if vcpus > 0 else set()
        else:
            pcpus = parse_cpu_spec(mask)
    except ValueError as exc:
        raise _bad("hw:cpu_dedicated_mask", mask, str(exc)) from None
    cpus = set(range(vcpus))
    if not pcpus <= cpus:
        raise _bad("hw:cpu_dedicated_mask", mask, f"CPUs {format_cpu_spec(pcpus - cpus)} are "
                   f"outside the flavor's {vcpus} vCPUs")
    if not pcpus or not (cpus - pcpus):
        raise _bad("hw:cpu_dedicated_mask", mask, "a mixed instance needs at least one "
                   "dedicated and one shared vCPU")
    return pcpus


def vpmem_labels(specs: Mapping[str, str]) -> list[str]:
    """The virtual persistent memory labels of ``hw:pmem`` (comma-separated; blanks
    dropped), one per namespace, in order (Nova's ``get_vpmems``)."""
    return [label.strip() for label in str(specs.get("hw:pmem") or "").split(",") if label.strip()]


@dataclass(frozen=True)
class CPUConstraints:
    """A flavor's and image's CPU constraints, each read as Nova's ``hardware`` getters
    read it: policy, thread policy (flavor and image, conflicts raise), emulator threads
    policy (flavor only), the dedicated mask (flavor only) and the realtime vCPUs (only
    with ``hw:cpu_realtime``; the image's mask wins over the flavor's). The checks
    between them are :func:`numa_topology_from_request`'s.
    """

    policy: str | None
    thread_policy: str | None
    emulator_policy: str | None
    dedicated: frozenset[int] | None
    realtime: frozenset[int] | None
    #: The ``hw:cpu_dedicated_mask`` text, for error messages.
    dedicated_mask: str | None = None

    def mixed_dedicated(self) -> set[int]:
        """The pinned vCPUs of a ``mixed`` instance: the dedicated mask or, failing that,
        the realtime vCPUs. Both, or neither, raise ExtraSpecError."""
        if self.realtime and self.dedicated:
            raise _bad("hw:cpu_dedicated_mask", self.dedicated_mask,
                       "a mixed instance takes its dedicated vCPUs from hw:cpu_dedicated_mask "
                       "or from a realtime mask, not both")
        if not (self.realtime or self.dedicated):
            raise _bad("hw:cpu_policy", MIXED, "a mixed instance needs hw:cpu_dedicated_mask "
                       "(or hw:cpu_realtime with a mask)")
        return set(self.dedicated or self.realtime or ())


def cpu_constraints(flavor: Any, image_props: Any) -> CPUConstraints:
    """The :class:`CPUConstraints` of a flavor (``vcpus``, ``extra_specs``) and image
    properties. A bad value raises :class:`~berth.errors.ExtraSpecError` naming the key."""
    specs: Mapping[str, str] = getattr(flavor, "extra_specs", None) or {}
    vcpus = int(flavor.vcpus)
    # Same order as Nova, so that of several problems the same one is reported.
    policy = _cpu_policy(specs, image_props)
    thread_policy = _thread_policy(specs, image_props)
    emulator_policy = _emulator_policy(specs)
    realtime = _realtime_cpus(specs, image_props, vcpus, emulator_policy)
    dedicated = _dedicated_mask(specs, vcpus)
    return CPUConstraints(policy, thread_policy, emulator_policy,
                          None if dedicated is None else frozenset(dedicated),
                          None if realtime is None else frozenset(realtime),
                          specs.get("hw:cpu_dedicated_mask"))


def numa_topology_from_request(flavor: Any, image_props: Any) -> InstanceNUMATopology | None:
    """The guest NUMA topology a flavor and image ask for, or None (Nova's
    ``numa_get_constraints``).

    A topology is built when ``hw:numa_nodes``, a page size, virtual persistent memory
    (``hw:pmem``) or a pinned CPU policy (dedicated/mixed) is requested. Without ``hw:numa_cpus.N``/``hw:numa_mem.N`` the vCPUs
    and memory are split evenly over the nodes; with them, every node must be given both
    and together they must cover every vCPU once and all the memory. The image may add
    what the flavor leaves open but may not contradict it. ``resources:PCPU`` /
    ``resources:VCPU`` stand for the dedicated / shared policy, the
    ``HW_CPU_HYPERTHREADING`` trait for the isolate (forbidden) / require (required)
    thread policy, and a mixed flavor may take its dedicated vCPUs from a realtime mask
    (``hw:cpu_realtime`` + ``hw:cpu_realtime_mask`` / ``hw_cpu_realtime_mask``). The
    emulator threads policy is read from the flavor only. Any bad value or conflict
    raises :class:`~berth.errors.ExtraSpecError` naming the key and the value.
    """
    specs: Mapping[str, str] = getattr(flavor, "extra_specs", None) or {}
    vcpus = int(flavor.vcpus)
    memory_mb = int(flavor.memory_mb)
    constraints = cpu_constraints(flavor, image_props)
    cpu_policy = constraints.policy
    thread_policy = constraints.thread_policy
    emulator_policy = constraints.emulator_policy
    realtime = None if constraints.realtime is None else set(constraints.realtime)
    dedicated = None if constraints.dedicated is None else set(constraints.dedicated)

    # Explicit VCPU/PCPU resources and the hyperthreading trait stand in for policies.
    requested_vcpu, requested_pcpu = _explicit_cpu_resources(specs)
    if cpu_policy and (requested_vcpu or requested_pcpu):
        raise _bad("hw:cpu_policy", cpu_policy, "cannot be combined with resources:VCPU or "
                   "resources:PCPU extra specs; use one or the other")
    if requested_vcpu and requested_pcpu:
        raise _bad("resources:PCPU", requested_pcpu, "cannot be combined with resources:VCPU")
    if requested_pcpu:
        wanted = vcpus + 1 if emulator_policy == EMULATOR_ISOLATE else vcpus
        if requested_pcpu != wanted:
            raise _bad("resources:PCPU", requested_pcpu, f"must be exactly {wanted} (the "
                       "flavor's vCPUs, plus one with isolated emulator threads)")
        cpu_policy = DEDICATED
    if requested_vcpu:
        cpu_policy = SHARED
    ht_trait = _hyperthreading_trait(specs, image_props)
    if thread_policy and ht_trait:
        raise _bad("trait:HW_CPU_HYPERTHREADING", ht_trait, "cannot be combined with a CPU "
                   "thread policy; use one or the other")
    if ht_trait == "forbidden":
        thread_policy = ISOLATE
    elif ht_trait == "required":
        thread_policy = REQUIRE

    if cpu_policy in (SHARED, None):
        if thread_policy:
            key = "hw:cpu_thread_policy" if specs.get("hw:cpu_thread_policy") else "hw_cpu_thread_policy"
            raise _bad(key, thread_policy, "a CPU thread policy needs hw:cpu_policy=dedicated "
                       "or mixed")
        if emulator_policy == EMULATOR_ISOLATE:
            raise _bad("hw:emulator_threads_policy", emulator_policy,
                       "isolated emulator threads need hw:cpu_policy=dedicated or mixed")
        if dedicated:
            raise _bad("hw:cpu_dedicated_mask", specs.get("hw:cpu_dedicated_mask"),
                       "needs hw:cpu_policy=mixed")
        if realtime:
            raise _bad("hw:cpu_realtime", specs.get("hw:cpu_realtime"),
                       "realtime vCPUs need hw:cpu_policy=dedicated or mixed")
    elif cpu_policy == DEDICATED:
        if dedicated:
            raise _bad("hw:cpu_dedicated_mask", specs.get("hw:cpu_dedicated_mask"),
                       "needs hw:cpu_policy=mixed, not dedicated")
    else:  # mixed
        dedicated = constraints.mixed_dedicated()

    nodes = _numa_nodes(specs, image_props)
    pagesize = _pagesize(specs, image_props)
    # Virtual persistent memory (hw:pmem labels) also gives the guest a NUMA topology.
    vpmems = vpmem_labels(specs)

    if not (nodes or pagesize or vpmems or cpu_policy in PINNING_POLICIES):
        # hw:numa_cpus.N / hw:numa_mem.N alone do not ask for a topology (as in Nova).
        return None

    cpus = set(range(vcpus))
    pcpus: set[int] = set()
    if cpu_policy == DEDICATED:
        pcpus = set(cpus)
    elif cpu_policy == MIXED and dedicated:
        pcpus = dedicated
    shared = cpus - pcpus
    nodes = nodes or 1
    cpu_list = _node_cpus(specs, image_props)
    mem_list = _node_mem(specs, image_props)

    cells: list[InstanceNUMACell] = []
    if cpu_list is None and mem_list is None:
        if vcpus % nodes or memory_mb % nodes:
            raise _bad("hw:numa_nodes", nodes, f"{vcpus} vCPUs and {memory_mb} MB cannot be "
                       "split evenly over the nodes; give hw:numa_cpus.N and hw:numa_mem.N")
        per_cpu, per_mem = vcpus // nodes, memory_mb // nodes
        for node in range(nodes):
            node_cpus = set(range(node * per_cpu, (node + 1) * per_cpu))
            cells.append(InstanceNUMACell(node, node_cpus & shared, node_cpus & pcpus, per_mem))
    elif cpu_list is not None and mem_list is not None:
        if len(cpu_list) != nodes or len(mem_list) != nodes:
            raise _bad("hw:numa_nodes", nodes, f"hw:numa_cpus.N and hw:numa_mem.N must be "
                       f"given for each of the {nodes} node(s) (got {len(cpu_list)} and "
                       f"{len(mem_list)})")
        unassigned = set(cpus)
        total_mem = 0
        for node in range(nodes):
            node_cpus = cpu_list[node]
            for cpu in sorted(node_cpus):
                if cpu >= vcpus:
                    raise _bad(f"hw:numa_cpus.{node}", format_cpu_spec(node_cpus),
                               f"vCPU {cpu} is out of range 0-{vcpus - 1}")
                if cpu not in unassigned:
                    raise _bad(f"hw:numa_cpus.{node}", format_cpu_spec(node_cpus),
                               f"vCPU {cpu} is assigned to more than one node")
                unassigned.discard(cpu)
            cells.append(InstanceNUMACell(node, node_cpus & shared, node_cpus & pcpus, mem_list[node]))
            total_mem += mem_list[node]
        if unassigned:
            raise _bad("hw:numa_cpus.0", format_cpu_spec(cpu_list[0]),
                       f"vCPUs {format_cpu_spec(unassigned)} are not assigned to any node")
        if total_mem != memory_mb:
            raise _bad("hw:numa_mem.0", mem_list[0], f"the nodes' memory adds up to "
                       f"{total_mem} MB, not the flavor's {memory_mb} MB")
    else:
        missing = "hw:numa_mem.N" if mem_list is None else "hw:numa_cpus.N"
        given = "hw:numa_cpus.0" if mem_list is None else "hw:numa_mem.0"
        value: Any = format_cpu_spec(cpu_list[0]) if cpu_list else (mem_list or [0])[0]
        raise _bad(given, value, f"needs {missing} for every node as well")

    for cell in cells:
        cell.pagesize = pagesize
        cell.cpu_policy = cpu_policy
        cell.cpu_thread_policy = thread_policy
    return InstanceNUMATopology(cells, emulator_policy)


def prepare_request(spec: Any, config: Any) -> None:
    """Fill ``spec.numa_topology`` and ``spec.pci_requests`` from the flavor and image
    when they are None (what Nova's API does before a request reaches the scheduler).

    Bad extra specs raise :class:`~berth.errors.ExtraSpecError`; a bad ``[pci] alias``
    raises :class:`~berth.errors.ConfigError`.
    """
    from berth.hardware.pci import pci_requests_from_flavor

    props = spec.image.properties if spec.image is not None else None
    if spec.numa_topology is None:
        spec.numa_topology = numa_topology_from_request(spec.flavor, props)
    if spec.pci_requests is None:
        spec.pci_requests = pci_requests_from_flavor(spec.flavor, config, props)


