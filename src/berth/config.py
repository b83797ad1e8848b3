"""nova.conf configuration: Nova's option names, types, defaults and help, read once.

Options are declared here, once, with oslo.config. :meth:`SchedulerConfig.from_files`
reads nova.conf-style INI files (``--config-file``, repeatable) or the old ``--name=value``
flag files of seeds 001-002, validates every value, and freezes the result into an
immutable :class:`SchedulerConfig` that the core receives as an argument: nothing in the
core reads a global at call time.

Deprecated names the seeds use (``scheduler_default_filters``, ``scheduler_weight_classes``,
``scheduler_available_filters``, ``metrics_weight_setting``, ``image_isolated``,
``host_isolated``, ...) are accepted with a warning through oslo.config's
``deprecated_name`` machinery.
"""

from __future__ import annotations

import configparser
import logging
import math
import os
import re
import tempfile
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from oslo_config import cfg
from oslo_config import types as cfg_types

from berth.errors import ConfigError, one_line

LOG = logging.getLogger(__name__)

ARCHITECTURES = (
    "alpha", "armv6", "armv7l", "armv7b", "aarch64", "cris", "i686", "ia64", "lm32", "m68k",
    "microblaze", "microblazeel", "mips", "mipsel", "mips64", "mips64el", "openrisc",
    "parisc", "parisc64", "ppc", "ppcle", "ppc64", "ppc64le", "ppcemb", "s390", "s390x",
    "sh4", "sh4eb", "sparc", "sparc64", "unicore32", "x86_64", "xtensa", "xtensaeb",
)  # fmt: skip


def _d(name: str) -> list[cfg.DeprecatedOpt]:
    """A deprecated DEFAULT-group name for an option that moved into a section."""
    return [cfg.DeprecatedOpt(name, group="DEFAULT")]


SCHEDULER_OPTS: list[cfg.Opt] = [
    cfg.IntOpt("max_attempts", default=3, min=1, deprecated_opts=_d("scheduler_max_attempts"),
               help="Maximum number of schedule attempts for a chosen host; the number of "
                    "alternates returned is max_attempts - 1."),
    cfg.IntOpt("discover_hosts_in_cells_interval", default=-1, min=-1,
               help="Periodic task interval for discovering new hosts; negative disables."),
    cfg.IntOpt("max_placement_results", default=1000, min=1,
               help="The limit on GET /allocation_candidates results."),
    cfg.IntOpt("workers", min=0, help="Number of scheduler workers (default: number of CPUs)."),
    cfg.BoolOpt("query_placement_for_routed_network_aggregates", default=False,
                help="Restrict hosts to the segment aggregates of requested networks."),
    cfg.BoolOpt("limit_tenants_to_placement_aggregate", default=False,
                help="Restrict tenants to aggregates with a matching filter_tenant_id key."),
    cfg.BoolOpt("placement_aggregate_required_for_tenants", default=False,
                help="With tenant limiting, fail tenants that have no aggregate."),
    cfg.BoolOpt("query_placement_for_image_type_support", default=False,
                help="Require the COMPUTE_IMAGE_TYPE_* trait of the image's disk format."),
    cfg.BoolOpt("enable_isolated_aggregate_filtering", default=False,
                help="Keep requests out of aggregates whose required traits they lack."),
    cfg.BoolOpt("image_metadata_prefilter", default=False,
                help="Translate image properties into required traits."),
]  # fmt: skip

FILTER_SCHEDULER_OPTS: list[cfg.Opt] = [
    cfg.IntOpt("host_subset_size", default=1, min=1,
               deprecated_opts=_d("scheduler_host_subset_size"),
               help="Choose randomly among the best N hosts; 1 always takes the best."),
    cfg.IntOpt("max_io_ops_per_host", default=8, min=0, deprecated_opts=_d("max_io_ops_per_host"),
               help="IoOpsFilter: hosts with this many or more I/O operations are rejected."),
    cfg.IntOpt("max_instances_per_host", default=50, min=1,
               deprecated_opts=_d("max_instances_per_host"),
               help="NumInstancesFilter: hosts with this many or more instances are rejected."),
    cfg.BoolOpt("track_instance_changes", default=True,
                deprecated_opts=_d("scheduler_tracks_instance_changes"),
                help="Track instance changes reported by the computes. On, the nodes of "
                     "a service host share one instance set, so a server-group stub placed "
                     "on one node during a multi-create is seen by its siblings; off, each "
                     "node has its own copy of the host's instances, as Nova reads them "
                     "from the database then."),
    cfg.MultiStrOpt("available_filters", default=["berth.filters.all_filters"],
                    deprecated_opts=_d("scheduler_available_filters"),
                    help="Filter classes (dotted paths, or functions returning lists of "
                         "classes) the scheduler may use; repeatable."),
    cfg.ListOpt("enabled_filters",
                default=["ComputeFilter", "ComputeCapabilitiesFilter", "ImagePropertiesFilter",
                         "ServerGroupAntiAffinityFilter", "ServerGroupAffinityFilter"],
                deprecated_opts=_d("scheduler_default_filters"),
                help="Filters run on every request, in this order (short class names)."),
    cfg.ListOpt("weight_classes", default=["berth.weighers.all_weighers"],
                deprecated_opts=_d("scheduler_weight_classes"),
                help="Weigher classes (dotted paths) used to rank the hosts."),
    cfg.FloatOpt("ram_weight_multiplier", default=1.0, deprecated_opts=_d("ram_weight_multiplier"),
                 help="RAMWeigher: positive spreads, negative stacks."),
    cfg.FloatOpt("cpu_weight_multiplier", default=1.0,
                 help="CPUWeigher: positive spreads, negative stacks."),
    cfg.FloatOpt("disk_weight_multiplier", default=1.0,
                 deprecated_opts=_d("disk_weight_multiplier"),
                 help="DiskWeigher: positive spreads, negative stacks."),
    cfg.FloatOpt("hypervisor_version_weight_multiplier", default=1.0,
                 help="HypervisorVersionWeigher: positive prefers newer hypervisors."),
    cfg.FloatOpt("num_instances_weight_multiplier", default=0.0,
                 help="NumInstancesWeigher: positive packs, negative spreads; 0 disables."),
    cfg.FloatOpt("io_ops_weight_multiplier", default=-1.0,
                 deprecated_opts=_d("io_ops_weight_multiplier"),
                 help="IoOpsWeigher: negative prefers idle hosts."),
    cfg.FloatOpt("image_props_weight_multiplier", default=0.0,
                 help="ImagePropertiesWeigher: positive packs instances of alike images."),
    cfg.ListOpt("image_props_weight_setting", default=[],
                help="ImagePropertiesWeigher: name=ratio pairs weighing each property."),
    cfg.FloatOpt("pci_weight_multiplier", default=1.0, min=0.0,
                 help="PCIWeigher: keeps PCI-rich hosts for PCI requests."),
    cfg.FloatOpt("soft_affinity_weight_multiplier", default=1.0, min=0.0,
                 deprecated_opts=_d("soft_affinity_weight_multiplier"),
                 help="ServerGroupSoftAffinityWeigher multiplier."),
    cfg.FloatOpt("soft_anti_affinity_weight_multiplier", default=1.0, min=0.0,
                 deprecated_opts=_d("soft_anti_affinity_weight_multiplier"),
                 help="ServerGroupSoftAntiAffinityWeigher multiplier."),
    cfg.FloatOpt("build_failure_weight_multiplier", default=1000000.0,
                 help="BuildFailureWeigher: how strongly recent build failures repel."),
    cfg.FloatOpt("cross_cell_move_weight_multiplier", default=1000000.0,
                 help="CrossCellWeigher: preference for the source cell on moves."),
    cfg.BoolOpt("shuffle_best_same_weighed_hosts", default=False,
                help="Shuffle the hosts that tie for the best weight."),
    cfg.StrOpt("image_properties_default_architecture", choices=ARCHITECTURES,
               help="ImagePropertiesFilter: architecture assumed for images without one."),
    # Seeds 001-002 call the IsolatedHostsFilter flags image_isolated and host_isolated.
    cfg.ListOpt("isolated_images", default=[],
                deprecated_opts=_d("isolated_images") + _d("image_isolated"),
                help="IsolatedHostsFilter: images that may run only on isolated hosts."),
    cfg.ListOpt("isolated_hosts", default=[],
                deprecated_opts=_d("isolated_hosts") + _d("host_isolated"),
                help="IsolatedHostsFilter: hosts reserved for isolated images."),
    cfg.BoolOpt("restrict_isolated_hosts_to_isolated_images", default=True,
                deprecated_opts=_d("restrict_isolated_hosts_to_isolated_images"),
                help="IsolatedHostsFilter: isolated hosts take only isolated images."),
    cfg.StrOpt("aggregate_image_properties_isolation_namespace",
               deprecated_opts=_d("aggregate_image_properties_isolation_namespace"),
               help="AggregateImagePropertiesIsolation: only keys with this namespace "
                    "(deprecated in 33.0.0)."),
    cfg.StrOpt("aggregate_image_properties_isolation_separator", default=".",
               deprecated_opts=_d("aggregate_image_properties_isolation_separator"),
               help="AggregateImagePropertiesIsolation: namespace separator "
                    "(deprecated in 33.0.0)."),
    cfg.BoolOpt("pci_in_placement", default=False,
                help="PCI request groups are sent to placement. Made by Nova's API and "
                     "conductor, which berth nova-scheduler serves; Berth's own services "
                     "refuse True (see check_own_services)."),
    # Berth's own lever between the weighers and the pre-Grizzly least-cost functions.
    cfg.StrOpt("weighing_strategy", default="weighers", choices=("weighers", "least_cost"),
               help="Berth: rank hosts with weight_classes (Nova) or with the legacy "
                    "least_cost_functions (lowest total cost wins). Left unset, naming "
                    "[DEFAULT] least_cost_functions selects least_cost."),
    # Berth's own lever: Nova 34 builds fresh host states for every request (§2.4).
    cfg.BoolOpt("consume_between_reports", default=False,
                help="Berth extension, what Nova did before Queens: keep each request's "
                     "virtual consumption in the scheduler's host states until the host "
                     "reports again."),
]  # fmt: skip

METRICS_OPTS: list[cfg.Opt] = [
    cfg.FloatOpt("weight_multiplier", default=1.0, help="MetricsWeigher multiplier."),
    # Seed 000 writes the option as metrics_weight_setting.
    cfg.ListOpt("weight_setting", default=[],
                deprecated_opts=_d("metrics_weight_setting")
                + [cfg.DeprecatedOpt("metrics_weight_setting", group="metrics")],
                help="name=ratio pairs of metrics to weigh."),
    cfg.BoolOpt("required", default=True,
                help="Raise when a host lacks a metric of weight_setting."),
    cfg.FloatOpt("weight_of_unavailable", default=-10000.0,
                 help="Weight of a host lacking a metric when required is False."),
]  # fmt: skip

DEFAULT_OPTS: list[cfg.Opt] = [
    cfg.FloatOpt("cpu_allocation_ratio", min=0.0,
                 help="Virtual CPU to physical CPU ratio; overrides the node's when set."),
    cfg.FloatOpt("ram_allocation_ratio", min=0.0,
                 help="Virtual RAM to physical RAM ratio; overrides the node's when set."),
    cfg.FloatOpt("disk_allocation_ratio", min=0.0,
                 help="Virtual disk to physical disk ratio; overrides the node's when set."),
    cfg.FloatOpt("initial_cpu_allocation_ratio", default=4.0, min=0.0,
                 help="CPU ratio for a node without one."),
    cfg.FloatOpt("initial_ram_allocation_ratio", default=1.0, min=0.0,
                 help="RAM ratio for a node without one."),
    cfg.FloatOpt("initial_disk_allocation_ratio", default=1.0, min=0.0,
                 help="Disk ratio for a node without one."),
    cfg.IntOpt("reserved_host_memory_mb", default=512, min=0,
               help="Memory kept for the host."),
    cfg.IntOpt("reserved_host_disk_mb", default=0, min=0, help="Disk kept for the host."),
    cfg.IntOpt("reserved_host_cpus", default=0, min=0, help="CPUs kept for the host."),
    cfg.MultiOpt("reserved_huge_pages", item_type=cfg_types.Dict(),
                 help="Per-NUMA-node reserved huge pages: one line per node, "
                      "node:0,size:2048,count:64 (read by nothing here)."),
    cfg.BoolOpt("allow_resize_to_same_host", default=False,
                help="A resize may keep the instance on its host (the host then holds the "
                     "old and the new flavor until the resize is confirmed)."),
    cfg.IntOpt("migrate_max_retries", default=-1, min=-1,
               help="Times a live migration asks the scheduler again after the conductor's "
                    "checks skipped its destination (-1: until no host is left)."),
    cfg.IntOpt("service_down_time", default=60, min=1,
               help="Seconds since the last heartbeat after which a service is down."),
    cfg.IntOpt("report_interval", default=10, min=1,
               help="Seconds between service heartbeats."),
    cfg.StrOpt("servicegroup_driver", default="db", choices=("db", "mc"),
               help="How service liveness is tracked."),
    cfg.StrOpt("default_availability_zone", default="nova",
               help="AZ of hosts in no AZ aggregate."),
    cfg.ListOpt("least_cost_functions",
                default=["nova.scheduler.least_cost.compute_fill_first_cost_fn"],
                help="Legacy cost functions (lowest total cost wins); each weighted by "
                     "the option <function name>_weight."),
    cfg.FloatOpt("noop_cost_fn_weight", default=1.0, help="Weight of noop_cost_fn."),
    cfg.FloatOpt("compute_fill_first_cost_fn_weight", default=-1.0,
                 help="Weight of compute_fill_first_cost_fn (negative spreads)."),
]  # fmt: skip

WORKAROUNDS_OPTS: list[cfg.Opt] = [
    cfg.BoolOpt("disable_fallback_pcpu_query", default=False,
                help="Do not retry a PCPU query with VCPU."),
    cfg.BoolOpt("skip_hypervisor_version_check_on_lm", default=False,
                help="A live migration may go to a host whose hypervisor version is older "
                     "than its source's."),
    cfg.BoolOpt("disable_group_policy_check_upcall", default=False,
                help="Skip the late check of a hard server-group policy when a build "
                     "reaches its host (a build that would break affinity or "
                     "anti-affinity, as two racing boots can, is otherwise rescheduled)."),
]

COMPUTE_OPTS: list[cfg.Opt] = [
    cfg.BoolOpt("packing_host_numa_cells_allocation_strategy", default=False,
                help="Pack instances onto the fullest NUMA cells first."),
    cfg.IntOpt("consecutive_build_service_disable_threshold", default=10,
               help="Non-zero makes computes report failed_builds (Nova sets no bound)."),
]

PCI_OPTS: list[cfg.Opt] = [
    cfg.MultiStrOpt("alias", default=[], deprecated_opts=_d("pci_alias"),
                    help="PCI aliases as JSON objects: name, vendor_id, product_id, "
                         "device_type, numa_policy."),
]

TRUSTED_COMPUTING_OPTS: list[cfg.Opt] = [
    cfg.StrOpt("attestation_server", help="Attestation server host."),
    cfg.StrOpt("attestation_server_ca_file", help="CA file of the attestation server."),
    cfg.PortOpt("attestation_port", default=8443, help="Attestation server port."),
    cfg.StrOpt("attestation_api_url", default="/OpenAttestationWebServices/V1.0",
               help="Attestation web API path."),
    cfg.StrOpt("attestation_auth_blob", secret=True, help="Attestation authentication blob."),
    cfg.IntOpt("attestation_auth_timeout", default=60, min=0,
               help="Seconds an attestation result stays valid."),
    cfg.BoolOpt("attestation_insecure_ssl", default=False,
                help="Skip TLS verification of the attestation server."),
    cfg.StrOpt("attestation_file",
               help="Berth: a YAML or JSON file mapping node names to trust levels "
                    "(trusted, untrusted, unknown), used when no attestation server is set."),
]  # fmt: skip

#: Every option group Berth reads, in declaration order.
OPTION_GROUPS: dict[str, list[cfg.Opt]] = {
    "DEFAULT": DEFAULT_OPTS,
    "scheduler": SCHEDULER_OPTS,
    "filter_scheduler": FILTER_SCHEDULER_OPTS,
    "metrics": METRICS_OPTS,
    "workarounds": WORKAROUNDS_OPTS,
    "compute": COMPUTE_OPTS,
    "pci": PCI_OPTS,
    "trusted_computing": TRUSTED_COMPUTING_OPTS,
}

_FLAG_RE = re.compile(r"^--(?:(?P<group>[a-z_]+)\.)?(?P<name>[A-Za-z0-9_]+)(?:=(?P<value>.*))?$")


def _freeze(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dict):
        return types.MappingProxyType({k: _freeze(v) for k, v in value.items()})
    return value


class ConfigGroup:
    """One frozen option group: ``group.option_name`` reads a value; nothing can be set."""

    __slots__ = ("_name", "_values")

    def __init__(self, name: str, values: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_values", types.MappingProxyType(dict(values)))

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r} in group [{self._name}]") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("configuration is immutable; use SchedulerConfig.replace")

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def get(self, name: str, default: Any = None) -> Any:
        """The option's value, or ``default`` if the group has no such option."""
        return self._values.get(name, default)

    def as_dict(self) -> dict[str, Any]:
        """The group's values."""
        return dict(self._values)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ConfigGroup) and dict(other._values) == dict(self._values)

    def __hash__(self) -> int:
        return hash((self._name, tuple(sorted(self._values))))

    def __repr__(self) -> str:
        return f"ConfigGroup({self._name!r})"


class SchedulerConfig:
    """The whole configuration, frozen: ``config.filter_scheduler.host_subset_size``.

    DEFAULT-group options are also readable directly (``config.service_down_time``), like
    Nova's ``CONF.service_down_time``. Build with :meth:`default`, :meth:`from_files` or
    :meth:`from_dict`; derive a variant with :meth:`replace`.
    """

    __slots__ = ("_groups", "sources")

    def __init__(self, groups: Mapping[str, Mapping[str, Any]], sources: Sequence[str] = ()) -> None:
        object.__setattr__(
            self, "_groups", {name: ConfigGroup(name, values) for name, values in groups.items()}
        )
        object.__setattr__(self, "sources", tuple(sources))

    def __getattr__(self, name: str) -> Any:
        groups = self._groups
        if name in groups:
            return groups[name]
        default = groups.get("DEFAULT")
        if default is not None and name in default:
            return getattr(default, name)
        raise AttributeError(f"no option group or DEFAULT option named {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("configuration is immutable; use SchedulerConfig.replace")

    def group(self, name: str) -> ConfigGroup:
        """The named group."""
        return self._groups[name]

    def groups(self) -> dict[str, ConfigGroup]:
        """Every group by name."""
        return dict(self._groups)

    # ------------------------------------------------------------------ builders
    @classmethod
    def default(cls) -> SchedulerConfig:
        """Nova's defaults for every option."""
        cached = _DEFAULT_CACHE.get("default")
        if cached is None:
            cached = _DEFAULT_CACHE["default"] = cls._load([], {})
        return cached

    @classmethod
    def from_files(
        cls, paths: Sequence[str | os.PathLike[str]], overrides: Mapping[str, Mapping[str, Any]] | None = None,
        *, warn_unknown: bool = True,
    ) -> SchedulerConfig:
        """Read nova.conf-style INI files (later files win) or ``--name=value`` flag files.

        Options Berth does not know in its groups, and sections that look like a
        misspelling of one, are logged as warnings (see :func:`unknown_options`).
        """
        files = [os.fspath(p) for p in paths]
        config = cls._load(files, overrides or {})
        if warn_unknown:
            for problem in unknown_options(files):
                LOG.warning("%s", problem)
        return config

    @classmethod
    def from_dict(cls, values: Mapping[str, Mapping[str, Any]]) -> SchedulerConfig:
        """Defaults overridden by ``{group: {option: value}}`` (values validated)."""
        return cls._load([], values)

    def replace(self, group: str, **values: Any) -> SchedulerConfig:
        """A copy with some options of one group changed (validated)."""
        overrides: dict[str, dict[str, Any]] = {g: {} for g in self._groups}
        overrides.setdefault(group, {}).update(values)
        merged = {name: grp.as_dict() for name, grp in self._groups.items()}
        for name, opts in overrides.items():
            for key, value in opts.items():
                _check_known(name, key)
                merged.setdefault(name, {})[key] = value
        validated = type(self)._load(
            [], {g: {k: _thaw(v) for k, v in o.items()} for g, o in merged.items()}
        )
        return SchedulerConfig(validated._groups_as_dicts(), self.sources)

    def _groups_as_dicts(self) -> dict[str, dict[str, Any]]:
        return {name: group.as_dict() for name, group in self._groups.items()}

    @classmethod
    def _load(
        cls, paths: list[str], overrides: Mapping[str, Mapping[str, Any]]
    ) -> SchedulerConfig:
        conf = cfg.ConfigOpts()
        for group_name, opts in OPTION_GROUPS.items():
            conf.register_opts(opts, group=None if group_name == "DEFAULT" else group_name)
        files: list[str] = []
        temp_files: list[str] = []
        try:
            for path in paths:
                if not os.path.isfile(path):
                    raise ConfigError(f"config file {path}: no such file")
                try:
                    if is_flag_file(path):
                        temp_files.append(flag_file_to_ini(path))
                        files.append(temp_files[-1])
                    else:
                        _check_ini_syntax(path)
                        files.append(path)
                except UnicodeDecodeError as exc:
                    raise ConfigError(f"config file {path}: {not_utf8(exc)}") from None
            args: list[str] = []
            for path in files:
                args += ["--config-file", path]
            try:
                conf(args=args, project="nova", default_config_files=[], use_env=False)
            except cfg.Error as exc:
                raise ConfigError(f"cannot read configuration: {exc}") from exc
            _register_cost_function_weights(conf)
            for group, group_overrides in overrides.items():
                for name, value in group_overrides.items():
                    if group == "DEFAULT" and name.endswith("_weight") and name not in conf:
                        conf.register_opt(cfg.FloatOpt(name, help="Weight of a cost function."))
                    _check_known(group, name, conf)
                    try:
                        conf.set_override(
                            name, _thaw(value), group=None if group == "DEFAULT" else group
                        )
                    except (ValueError, TypeError) as exc:
                        raise ConfigError(f"[{group}] {name} = {value!r}: {exc}") from exc
            values = _read_all(conf)
            _imply_least_cost(conf, values)
        finally:
            for path in temp_files:
                os.unlink(path)
        return cls(values, paths)


_DEFAULT_CACHE: dict[str, SchedulerConfig] = {}


def check_own_services(config: SchedulerConfig) -> None:
    """Refuse what only a Nova deployment around Berth's scheduler can honour, where
    Berth runs its own API, conductor and compute agents (``berth serve``, its separate
    processes, and the offline commands on a cloud file).

    ``[filter_scheduler] pci_in_placement = True``: Nova's API and conductor turn a
    flavor's PCI alias requests into request groups (``requested_resources``) and Nova's
    computes report their PCI devices to placement; its scheduler only sends the groups
    it is given, so ``berth nova-scheduler`` takes the option as Nova's does. Berth's own
    API makes no such groups and its agents report no PCI devices to placement: boots
    would claim no PCI inventory where Nova's computes expect it.
    """
    if config.filter_scheduler.pci_in_placement:
        raise ConfigError(
            "[filter_scheduler] pci_in_placement = True: only berth nova-scheduler takes it "
            "(Nova's conductor makes the PCI request groups and Nova's computes report the "
            "devices to placement); Berth's own API and compute agents do neither, so they "
            "match PCI devices from the hosts' pci_stats only, as Nova does with it False; "
            "leave it False", field="[filter_scheduler] pci_in_placement")


def _thaw(value: Any) -> Any:
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    if isinstance(value, types.MappingProxyType):
        return {k: _thaw(v) for k, v in value.items()}
    return value


def _check_known(group: str, name: str, conf: cfg.ConfigOpts | None = None) -> None:
    if group not in OPTION_GROUPS:
        raise ConfigError(f"unknown option group [{group}]; known: {', '.join(OPTION_GROUPS)}")
    names = {opt.dest for opt in OPTION_GROUPS[group]}
    if conf is not None and group == "DEFAULT":
        names |= set(conf.keys())
    if name not in names:
        raise ConfigError(f"unknown option [{group}] {name}")


def _read_all(conf: cfg.ConfigOpts) -> dict[str, dict[str, Any]]:
    values: dict[str, dict[str, Any]] = {}
    for group in OPTION_GROUPS:
        target: Any = conf if group == "DEFAULT" else conf[group]
        group_values: dict[str, Any] = {}
        defaults = {opt.dest: opt.default for opt in OPTION_GROUPS[group]}
        names = list(defaults)
        if group == "DEFAULT":
            names += [n for n in conf if n.endswith("_weight") and n not in names]
        for name in names:
            try:
                value = getattr(target, name)
            except (cfg.Error, ValueError) as exc:
                # A bad value, or a $reference to an option that does not exist.
                raise ConfigError(f"[{group}] {name}: {_oslo_problem(exc)}") from None
            if value is None and defaults.get(name) is not None:
                # oslo.config reads "name =" as None for a number; nothing takes None.
                raise ConfigError(f"[{group}] {name}: empty value; give one, or leave the "
                                  f"option out for its default ({defaults[name]})")
            if (isinstance(value, int) and not isinstance(value, bool)
                    and not -(1 << 63) <= value < (1 << 63)):
                raise ConfigError(f"[{group}] {name} = {value}: out of the 64-bit "
                                  "integer range")
            # oslo.config's FloatOpt takes 'nan' and 'inf'; a multiplier or ratio of
            # either makes every weight NaN (or every host equal), so refuse them here.
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"[{group}] {name} = {value}: must be a finite number")
            group_values[name] = _freeze(value)
        values[group] = group_values
    return values


def _imply_least_cost(conf: cfg.ConfigOpts, values: dict[str, dict[str, Any]]) -> None:
    """Naming ``least_cost_functions`` selects least-cost weighing (seeds 001-002).

    Seed 001's flag file (``--least_cost_functions=...``,
    ``--compute_fill_first_cost_fn_weight=-1.0``) has no Berth switch in it: a reader who
    names cost functions means them to rank hosts. Unless ``[filter_scheduler]
    weighing_strategy`` is set explicitly (either way), it becomes ``least_cost``, with a
    notice. Nova 34 has no such option, so a modern nova.conf never triggers this.
    """
    def explicit(name: str, group: str | None = None) -> bool:
        try:
            info = conf.get_location(name, group)
        except (cfg.NoSuchOptError, cfg.NoSuchGroupError):
            return False
        return info is not None and info.location is not cfg.Locations.opt_default

    if explicit("weighing_strategy", "filter_scheduler") or not explicit("least_cost_functions"):
        return
    values["filter_scheduler"]["weighing_strategy"] = "least_cost"
    LOG.warning("[DEFAULT] least_cost_functions is set: hosts are ranked by least cost "
                "(cost = sum of weight x function, lowest wins) instead of by weight_classes; "
                "set [filter_scheduler] weighing_strategy = weighers to keep the weighers")


_OSLO_NOT_VALID = re.compile(
    r"^Value for option \S+ from LocationInfo\(.*?detail='(?P<file>[^']*)'\) is not valid: ")


def _oslo_problem(exc: Exception) -> str:
    """oslo.config's complaint about a value, without its LocationInfo repr: "in FILE:
    REASON" for a value read from a file."""
    text = str(exc)
    found = _OSLO_NOT_VALID.match(text)
    if found is None:
        return text
    where = f"in {found['file']}: " if found["file"] else ""
    return where + text[found.end():]


def _register_cost_function_weights(conf: cfg.ConfigOpts) -> None:
    """Register ``<function>_weight`` for every configured least-cost function.

    Each cost function's weight is an option named after it (seed 001); custom functions
    get theirs registered here so that a config file may set them. The default is None:
    the least-cost strategy reports a missing weight at start-up.
    """
    try:
        functions = conf.least_cost_functions or []
    except cfg.Error:
        return
    for path in functions:
        name = f"{path.rsplit('.', 1)[-1]}_weight"
        if name not in conf:
            conf.register_opt(cfg.FloatOpt(name, help=f"Weight of cost function {path}."))


def not_utf8(exc: UnicodeDecodeError) -> str:
    """The one-line reason a file is not UTF-8 text, naming the offending byte (not its
    offset: a decoder reading a file in chunks counts from the chunk)."""
    return f"not UTF-8 text (byte 0x{exc.object[exc.start]:02x})"


def is_flag_file(path: str) -> bool:
    """True for an old-style flag file: its first meaningful line starts with ``--``."""
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            return stripped.startswith("--")
    return False


def flag_file_to_ini(path: str) -> str:
    """Translate a ``--name=value`` flag file into a temporary INI file; return its path.

    ``--name=value`` goes to DEFAULT (where oslo's deprecated names find it);
    ``--group.name=value`` (seed 000's form) goes to ``[group]``. A bare ``--flag`` is
    ``True`` and ``--noflag`` is ``False``, as gflags had it.
    """
    sections: dict[str, list[tuple[str, str]]] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            stripped = line.strip()
            if not stripped or stripped.startswith("#"):
                continue
            match = _FLAG_RE.match(stripped)
            if not match:
                raise ConfigError(f"{path}:{number}: not a --name=value flag: {stripped!r}")
            group = match.group("group") or "DEFAULT"
            name = match.group("name")
            value = match.group("value")
            if value is None:
                if name.startswith("no") and name[2:]:
                    name, value = name[2:], "false"
                else:
                    value = "true"
            LOG.warning("%s:%d: flag-file syntax is deprecated; use [%s] %s = %s in nova.conf",
                        path, number, group, name, value)
            sections.setdefault(group, []).append((name, value))
    handle_fd, ini_path = tempfile.mkstemp(prefix="berth-flags-", suffix=".conf")
    with os.fdopen(handle_fd, "w", encoding="utf-8") as out:
        for group, items in sections.items():
            out.write(f"[{group}]\n")
            for name, value in items:
                out.write(f"{name} = {value}\n")
    return ini_path


def _check_ini_syntax(path: str) -> None:
    parser = configparser.RawConfigParser(strict=False)
    try:
        with open(path, encoding="utf-8") as handle:
            parser.read_file(handle)
    except configparser.Error as exc:
        raise ConfigError(f"config file {path}: {_syntax_error(exc)}") from exc


def _syntax_error(exc: configparser.Error) -> str:
    """configparser's message on one line, with the line number it gives."""
    if isinstance(exc, configparser.MissingSectionHeaderError):
        return f"line {exc.lineno}: no [section] header before {exc.line.strip()!r}"
    if isinstance(exc, configparser.ParsingError):
        lineno, line = exc.errors[0]  # the line as repr() shows it
        return f"line {lineno}: cannot parse {line}"
    return one_line(exc)


def unknown_options(paths: Iterable[str]) -> list[str]:
    """Options and sections the files set that neither Berth nor Nova knows: likely
    typos (:mod:`berth.config_check`)."""
    from berth.config_check import check_files

    return check_files(paths).problems
