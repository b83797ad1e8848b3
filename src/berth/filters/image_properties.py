"""ImagePropertiesFilter: pass hosts that support the image's architecture, hypervisor
type and VM mode (and its requested hypervisor version and physical address bits).

The image's canonicalized ``hw_architecture``, ``img_hv_type`` and ``hw_vm_mode`` must all
be members of one of the host's ``supported_instances`` triples; that triple's host must
also satisfy ``img_hv_requested_version`` (e.g. ``">=6.0,<7"``) and have at least
``hw_maxphysaddr_bits`` in its ``cpu_info``. An image setting none of the three passes
everywhere. Option: ``[filter_scheduler] image_properties_default_architecture`` (the
architecture of images that set none). Lever: the image properties (reference §3.4).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from packaging.version import InvalidVersion, Version

from berth.config import ARCHITECTURES
from berth.errors import HostStateError, ImagePropertyError, InputError
from berth.filters.base import BaseHostFilter, Reject
from berth.model.hvspec import (
    ARCH_ALIASES,
    HV_ALIASES,
    HV_TYPES,
    VM_MODE_ALIASES,
    VM_MODES,
    host_triple,
)

if TYPE_CHECKING:
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

_PREDICATE_PART = re.compile(r"^\s*(<=|>=|<|>|!=|==)\s*(\S+?)\s*$")
_COMPARATORS = {
    "<=": Version.__le__, ">=": Version.__ge__, "<": Version.__lt__, ">": Version.__gt__,
    "!=": Version.__ne__, "==": Version.__eq__,
}


def _canonicalize(prop: str, value: Any, aliases: dict[str, str], valid: Any) -> str | None:
    if value is None or value == "":
        return None
    name = str(value).lower()
    name = aliases.get(name, name)
    if name not in valid:
        raise ImagePropertyError(prop, value, f"not a valid value (expected one of "
                                              f"{', '.join(sorted(valid))})")
    return name


def canonical_architecture(value: Any) -> str | None:
    """Lower-case; i386/i486/i586/x86_32/x86_32p -> i686, amd64 -> x86_64; None stays."""
    return _canonicalize("hw_architecture", value, ARCH_ALIASES, frozenset(ARCHITECTURES))


def canonical_hv_type(value: Any) -> str | None:
    """Lower-case; xapi -> xen; None stays."""
    return _canonicalize("img_hv_type", value, HV_ALIASES, HV_TYPES)


def canonical_vm_mode(value: Any) -> str | None:
    """Lower-case; pv -> xen, hv and baremetal -> hvm; None stays."""
    return _canonicalize("hw_vm_mode", value, VM_MODE_ALIASES, VM_MODES)


def version_to_str(version: int) -> str:
    """A hypervisor version int in base-1000 groups: 6000000 -> ``"6.0.0"``."""
    parts: list[str] = []
    while version != 0:
        parts.insert(0, str(version % 1000))
        version //= 1000
    return ".".join(parts)


def parse_version_predicate(text: str) -> list[tuple[str, Version]]:
    """``">=6.0,<7"`` -> ``[(">=", 6.0), ("<", 7)]``; InputError naming the property when
    a part is not ``(<=|>=|<|>|!=|==) VERSION``."""
    conditions: list[tuple[str, Version]] = []
    for part in str(text).split(","):
        found = _PREDICATE_PART.match(part)
        problem = None if found else f"{part.strip()!r} is not '<op> <version>'"
        if found:
            try:
                conditions.append((found.group(1), Version(found.group(2))))
            except InvalidVersion:
                problem = f"{found.group(2)!r} is not a version"
        if problem:
            raise ImagePropertyError("img_hv_requested_version", text,
                                     f"{problem} (expected e.g. '>=6.0,<7')")
    return conditions


@dataclass(frozen=True)
class ImageRequirements:
    """What an image asks of a host, parsed once per request."""

    arch: str | None
    hv_type: str | None
    vm_mode: str | None
    version_predicate: str | None
    version_conditions: tuple[tuple[str, Version], ...]
    maxphysaddr_bits: int | None

    @property
    def asks_nothing(self) -> bool:
        """Rule 1: none of the three properties is set (version and bits are ignored)."""
        return not (self.arch or self.hv_type or self.vm_mode)

    def props_text(self) -> str:
        """The requested triple for explanations (``-`` for unset parts)."""
        return ",".join(p or "-" for p in (self.arch, self.hv_type, self.vm_mode))


def image_requirements(spec_obj: RequestSpec, default_arch: str | None) -> ImageRequirements:
    """Canonicalize and parse the image's properties (InputError if one is invalid).

    Parsed forms are cached per distinct property values, so the per-host path parses an
    image once.
    """
    props: Any = spec_obj.image.properties if spec_obj.image is not None else {}
    values = (props.get("hw_architecture", default_arch), props.get("img_hv_type"),
              props.get("hw_vm_mode"), props.get("img_hv_requested_version"),
              props.get("hw_maxphysaddr_bits"))
    try:
        return _image_requirements(*values)
    except TypeError:  # an unhashable value: parse without the cache
        return _image_requirements.__wrapped__(*values)


@functools.lru_cache(maxsize=256)
def _image_requirements(
    arch: Any, hv_type: Any, vm_mode: Any, predicate: Any, bits: Any
) -> ImageRequirements:
    if bits:
        try:
            bits = int(bits)
        except (TypeError, ValueError):
            raise ImagePropertyError("hw_maxphysaddr_bits", bits, "not an integer") from None
    return ImageRequirements(
        arch=canonical_architecture(arch),
        hv_type=canonical_hv_type(hv_type),
        vm_mode=canonical_vm_mode(vm_mode),
        version_predicate=str(predicate) if predicate else None,
        version_conditions=tuple(parse_version_predicate(predicate)) if predicate else (),
        maxphysaddr_bits=bits or None,
    )


def host_maxphysaddr_bits(cpu_info: Any, host: str) -> float | None:
    """The ``maxphysaddr.bits`` of a host's cpu_info (a JSON string), or None if unknown.

    Nova calls ``.get`` on the raw string and would crash; Berth decodes it. cpu_info
    that is not a JSON object, or has no bits, means "unknown" (the check is skipped).
    """
    if isinstance(cpu_info, str):
        try:
            cpu_info = json.loads(cpu_info)
        except ValueError:
            return None
    if not isinstance(cpu_info, dict):
        return None
    maxphysaddr = cpu_info.get("maxphysaddr", {})
    bits = maxphysaddr.get("bits") if isinstance(maxphysaddr, dict) else None
    if not bits:
        return None
    if isinstance(bits, bool) or not isinstance(bits, (int, float)):
        raise HostStateError(
            f"host {host!r} reports cpu_info maxphysaddr bits {bits!r}, not a number",
            host=host, value=bits,
        )
    return float(bits)


def check_host(
    req: ImageRequirements,
    supported_instances: list[list[str]] | None,
    hypervisor_version: int | None,
    cpu_info: Any,
    host: str,
) -> Reject | None:
    """Rules 2-4 of reference §3.4 for one host (rule 1 is the caller's)."""
    if not supported_instances:
        return Reject.of("image properties unsupported", requested=req.props_text(),
                         supported="(none)")
    wanted = [p for p in (req.arch, req.hv_type, req.vm_mode) if p]
    version_ok: bool | None = None
    bits_ok: bool | None = None
    host_bits: float | None = None
    for raw in supported_instances:
        triple = host_triple(raw)
        if not all(p in triple for p in wanted):
            continue
        if version_ok is None:
            version_ok = True
            if hypervisor_version and req.version_conditions:
                if hypervisor_version < 0:
                    raise HostStateError(f"host {host!r} reports a negative hypervisor_version "
                                     f"{hypervisor_version}", host=host)
                host_version = Version(version_to_str(int(hypervisor_version)))
                version_ok = all(_COMPARATORS[op](host_version, v)
                                 for op, v in req.version_conditions)
        if not version_ok:
            continue
        if bits_ok is None:
            host_bits = host_maxphysaddr_bits(cpu_info, host) if req.maxphysaddr_bits else None
            bits_ok = host_bits is None or host_bits >= (req.maxphysaddr_bits or 0)
        if bits_ok:
            return None
    if version_ok is None:
        return Reject.of("image properties unsupported", requested=req.props_text(),
                         supported=";".join(",".join(map(str, t)) for t in supported_instances))
    if not version_ok:
        return Reject.of("image properties unsupported",
                         requested_version=req.version_predicate,
                         hypervisor_version=version_to_str(int(hypervisor_version or 0)))
    return Reject.of("image properties unsupported", requested_bits=req.maxphysaddr_bits,
                     host_bits=host_bits)


class ImagePropertiesFilter(BaseHostFilter):
    """Pass hosts supporting the image's architecture, hypervisor type and VM mode.

    The supporting host must also satisfy the image's requested hypervisor version and
    physical address bits.
    """

    run_filter_once_per_request: ClassVar[bool] = True
    RUN_ON_REBUILD: ClassVar[bool] = True

    def _requirements(self, spec_obj: RequestSpec) -> ImageRequirements:
        return image_requirements(
            spec_obj, self.config.filter_scheduler.image_properties_default_architecture
        )

    def validate_request(self, spec_obj: RequestSpec) -> None:
        """Reject invalid architecture/hypervisor/VM-mode values, version predicates and
        bit counts up front."""
        self._requirements(spec_obj)

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """``image properties unsupported`` with the requested and supported values."""
        req = self._requirements(spec_obj)
        if req.asks_nothing:
            return None
        return check_host(req, host_state.supported_instances, host_state.hypervisor_version,
                          host_state.cpu_info, host_state.host)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """O(n), no sort: :func:`check_host` passes exactly when a triple holds the
        requested values (per ``supported_instances`` signature, cached on the snapshot),
        the version satisfies the predicate (once per distinct version, only when the
        image has one) and the bits suffice (per ``cpu_info`` signature, only when the
        image asks)."""
        req = self._requirements(spec_obj)
        n = len(hosts)
        if req.asks_nothing or n == 0:
            return np.ones(n, dtype=bool)
        snapshot = hosts.snapshot
        wanted = tuple(p for p in (req.arch, req.hv_type, req.vm_mode) if p)
        triples = snapshot.table("supported_instances")
        matching = snapshot.table_cached(
            ("ImagePropertiesFilter.triples", wanted, len(triples)),
            lambda: np.array([any(all(p in host_triple(t) for p in wanted) for t in si)
                              if si else False for si in triples], dtype=bool))
        ok: np.ndarray = matching[hosts.codes("supported_instances")]
        raising: list[int] = []  # positions of hosts whose check raises
        if req.version_conditions:
            versions = hosts.col("hypervisor_version")
            checked = np.flatnonzero(ok & ~np.isnan(versions))
            if len(checked):
                values, inverse = np.unique(versions[checked], return_inverse=True)
                inverse = inverse.reshape(-1)
                verdicts = np.ones(len(values), dtype=bool)
                for k, value in enumerate(values.tolist()):
                    version = int(value)
                    if version < 0:
                        verdicts[k] = False
                        raising.append(int(checked[np.argmax(inverse == k)]))
                    elif version:  # 0 means "unknown": check_host skips the check
                        host_version = Version(version_to_str(version))
                        verdicts[k] = all(_COMPARATORS[op](host_version, v)
                                          for op, v in req.version_conditions)
                ok[checked] = verdicts[inverse]
        if req.maxphysaddr_bits:
            cpu_infos = snapshot.table("cpu_info")
            bits, bad_bits = snapshot.table_cached(
                ("ImagePropertiesFilter.bits", len(cpu_infos)), lambda: _bits_table(cpu_infos))
            codes = hosts.codes("cpu_info")
            if bad_bits.any():
                bad = np.flatnonzero(ok & bad_bits[codes])
                if len(bad):
                    raising.append(int(bad[0]))
            host_bits = bits[codes]
            ok &= np.isnan(host_bits) | (host_bits >= req.maxphysaddr_bits)
        if raising:
            # The per-host path's error: the first host, in order, whose check raises.
            at = min(raising)
            row = int(hosts.rows[at])
            version = hosts.col("hypervisor_version")[at]
            check_host(req, snapshot.interned_value("supported_instances", row),
                       None if np.isnan(version) else int(version),
                       snapshot.interned_value("cpu_info", row), str(snapshot.obj("host")[row]))
        return ok


def _bits_table(cpu_infos: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Per ``cpu_info`` signature: its maxphysaddr bits (NaN: unknown) and whether
    reading them raises (the per-host error names the host)."""
    bits = np.full(len(cpu_infos), np.nan)
    bad = np.zeros(len(cpu_infos), dtype=bool)
    for code, cpu_info in enumerate(cpu_infos):
        try:
            value = host_maxphysaddr_bits(cpu_info, "")
        except InputError:
            bad[code] = True
            continue
        if value is not None:
            bits[code] = value
    return bits, bad
