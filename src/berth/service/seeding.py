"""A cloud file's hosts, registered as ``berth serve`` and offline scheduling run them.

:func:`seed_cloud` puts a loaded cloud into a stack through the compute-agent path:
every node's provider (with its traits, extra inventories and nested providers), the
sharing providers, aggregates, the file's instances with their allocations and the
usage beyond them, server groups, and each node's first report. ``berth serve --cloud``
and ``berth schedule`` (over a store in a scratch database) both start here, so what one
schedules against is what the other does.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from berth.cloudfile import Cloud, load_cloud, stable_uuid
from berth.errors import CloudFileError, one_line
from berth.filters.compute import effective_service_down_time
from berth.model.request import Flavor
from berth.placement.client import NotFoundError, PlacementAPIError
from berth.provider_tree import NodeProviders
from berth.service.compute import ServiceSwitches, publish_provider

LOG = logging.getLogger("berth.service")


def cloud_nodes(cloud: Any) -> list[Any]:
    """The compute nodes of a loaded cloud file, as agents register them: size,
    capabilities, ratios, the host's own stats and its numeric ``io_workload``."""
    from berth.service.compute import ComputeNodeSpec

    snap = cloud.snapshot
    nodes = []
    for row in range(len(snap)):
        num = {name: snap.num(name)[row] for name in (
            "vcpus_total", "total_usable_ram_mb", "total_usable_disk_gb", "hypervisor_version",
            "cpu_allocation_ratio", "ram_allocation_ratio", "disk_allocation_ratio")}
        # The host's own stats go with it; the agent counts num_instances and
        # failed_builds itself and reports a numeric io_workload from the node's.
        stats = {str(k): str(v) for k, v in (snap.interned_value("stats", row) or {}).items()}
        io_workload = stats.get("io_workload", "0")
        if io_workload.isdigit():
            stats.pop("io_workload", None)
        for own in ("num_instances", "failed_builds"):
            stats.pop(own, None)
        placement = cloud.providers.get(snap.obj("uuid")[row]) or NodeProviders()
        nodes.append(ComputeNodeSpec(
            traits=list(placement.traits), pcpus=placement.pcpus,
            resources={rc: dict(inv) for rc, inv in placement.resources.items()},
            children=list(placement.children),
            host=snap.obj("host")[row], nodename=snap.obj("nodename")[row],
            uuid=snap.obj("uuid")[row], cell_uuid=snap.interned_value("cell_uuid", row),
            vcpus=int(num["vcpus_total"]), memory_mb=int(num["total_usable_ram_mb"]),
            local_gb=int(num["total_usable_disk_gb"]),
            hypervisor_type=snap.interned_value("hypervisor_type", row) or "QEMU",
            hypervisor_version=(int(num["hypervisor_version"])
                                if num["hypervisor_version"] == num["hypervisor_version"] else 0),
            cpu_info=snap.interned_value("cpu_info", row) or "{}",
            supported_instances=snap.interned_value("supported_instances", row),
            host_ip=snap.obj("host_ip")[row], numa_topology=snap.obj("numa_topology")[row],
            pci_stats=snap.obj("pci_stats")[row], metrics=list(snap.obj("metrics")[row]),
            cpu_allocation_ratio=float(num["cpu_allocation_ratio"]),
            ram_allocation_ratio=float(num["ram_allocation_ratio"]),
            disk_allocation_ratio=float(num["disk_allocation_ratio"]),
            stats=stats, io_workload=int(io_workload) if io_workload.isdigit() else 0))
    return nodes


def register_sharing(client: Any, cloud: Cloud) -> None:
    """Publish the cloud's sharing providers: inventories, traits (with
    MISC_SHARES_VIA_AGGREGATE) and the placement aggregates of their host aggregates."""
    uuids = {a.name: a.uuid for a in cloud.snapshot.aggregates}
    for provider in cloud.sharing:
        assert provider.uuid is not None
        publish_provider(client, provider.uuid, provider.name,
                         inventory=provider.resources, traits=provider.traits,
                         aggregates=[uuids[name] for name in provider.aggregates])


def seed_from_cloud(stack: Any, path: str, *, now: float | None = None
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Load the cloud file at ``path`` and :func:`seed_cloud` it; returns (flavors,
    images)."""
    now = time.time() if now is None else now
    return seed_loaded(stack, load_cloud(path, stack.config, now=now), path, now=now)


def seed_loaded(stack: Any, cloud: Cloud, path: str, *, now: float
                ) -> tuple[dict[str, Any], dict[str, Any]]:
    """:func:`seed_from_cloud` of a cloud file loaded already (at ``now``)."""
    seed_cloud(stack, cloud, path, now=now)
    for name, bad in cloud.broken_images.items():
        LOG.warning("%s: image %r is left out, boots with it fail: %s", path, name, bad.problem)
    return cloud.known_flavors(), dict(cloud.images)


def seed_cloud(stack: Any, cloud: Cloud, path: str, *, now: float, fresh: bool = False) -> None:
    """Register the hosts of ``cloud`` (loaded from ``path``) through their agents, at
    the instant ``now`` (a host the file says is down keeps its older heartbeat).

    ``fresh`` says the store is empty (offline scheduling's scratch store): nothing
    stored can conflict with the file, so its checks against stored allocations are
    skipped."""
    nodes = cloud_nodes(cloud)
    if not fresh:
        check_against_allocations(stack, nodes, path)
    register_sharing(stack.agent_client or stack.client, cloud)
    # Every host reports at registration and again once its state is restored: both
    # reports are written at the end, the latest of each host, in one transaction.
    stack.records.begin_deferred()
    try:
        _seed_hosts(stack, cloud, path, nodes, now=now, fresh=fresh)
    finally:
        stack.records.end_deferred()


def _seed_hosts(stack: Any, cloud: Cloud, path: str, nodes: Sequence[Any], *, now: float,
                fresh: bool) -> None:
    """Register ``nodes`` and restore their state from ``cloud`` (see :func:`seed_cloud`)."""
    from berth.moves import instance_from_cloud

    snap = cloud.snapshot
    agents = stack.register_hosts(nodes, snap.aggregates, cloud.cells.values())
    for group in cloud.server_groups.values():
        stack.groups.put(group)
    flavors_by_id = {f.id: f for f in cloud.known_flavors().values()}
    config = stack.config
    down_time = effective_service_down_time(config.service_down_time, config.report_interval)
    # The file's instances (and the usage holders beyond them) exist without a build by
    # Berth: recorded as active builds, so the audit does not take them for orphans.
    existing: dict[str, str | None] = {}
    for row, agent in enumerate(agents):
        service = snap.obj("service")[row]
        failed = snap.num("failed_builds")[row]
        if "failed_builds" in (snap.interned_value("stats", row) or {}) and not math.isnan(failed):
            agent.failed_builds = int(failed)
        placed: list[Flavor] = []
        unsized = 0  # listed without a flavor: counted, not placed (resources unknown)
        for uuid, inst in snap.obj("instances")[row].items():
            flavor = flavors_by_id.get(inst.instance_type_id)
            if flavor is None:
                unsized += 1
                continue
            placed.append(flavor)
            known = stack.instances.get(uuid)
            if known is not None and known.host != agent.node.host:
                # Moved by an earlier run: it runs (and is allocated) where it went; the
                # file's usage of this host no longer includes it.
                continue
            existing[uuid] = agent.node.host
            _allocate(stack, uuid, agent.uuid, flavor, inst.project_id or "seed", fresh=fresh)
            agent.spawn(uuid, flavor, inst.project_id, publish=False,
                        image_properties=inst.image_properties)
            if known is None:
                # Known with its spec from now on, so it can be moved like a booted one.
                stack.instances.record(uuid, agent.node.host,
                                       agent.node.nodename or agent.node.host,
                                       instance_from_cloud(cloud, uuid).spec)
        # Usage the file states beyond its instances (and the reserved amounts) is held
        # by one consumer per host, so placement and the reports agree.
        extra = Flavor(
            name="preexisting",
            vcpus=max(0, int(snap.num("vcpus_used")[row]) - config.reserved_host_cpus
                      - sum(f.vcpus for f in placed)),
            memory_mb=max(0, int(snap.num("total_usable_ram_mb")[row] - snap.num("free_ram_mb")[row])
                          - config.reserved_host_memory_mb - sum(f.memory_mb for f in placed)),
            root_gb=max(0, int(snap.num("disk_mb_used")[row]) // 1024
                        - math.ceil(config.reserved_host_disk_mb / 1024)
                        - sum(f.root_gb + f.ephemeral_gb for f in placed)))
        if extra.vcpus or extra.memory_mb or extra.root_gb:
            node = agent.node
            # One consumer may not exceed max_unit (the node's total) per class.
            parts = max(math.ceil(extra.vcpus / max(node.vcpus, 1)),
                        math.ceil(extra.memory_mb / max(node.memory_mb, 1)),
                        math.ceil(extra.root_gb / max(node.local_gb, 1)), 1)
            if parts > MAX_USAGE_PARTS:
                raise CloudFileError(
                    f"{path}: host {node.host}: its usage beyond its instances needs {parts} "
                    f"consumers of at most one host's size each (more than "
                    f"{MAX_USAGE_PARTS}); check its *_used fields and allocation ratios")
            holders = {stable_uuid("preexisting", agent.uuid, str(i)): Flavor(
                name="preexisting", vcpus=_share(extra.vcpus, parts, i),
                memory_mb=_share(extra.memory_mb, parts, i),
                root_gb=_share(extra.root_gb, parts, i)) for i in range(parts)}
            existing.update(dict.fromkeys(holders, agent.node.host))
            # A restart on the same database finds them held already: nothing is
            # written, and no inventory is raised where other processes may schedule.
            missing = holders if fresh else {
                holder: share for holder, share in holders.items()
                if not stack.client.get_allocations(holder).allocations}
            if missing:
                with _room_for(agent, extra, missing.values(), placed, config, path):
                    for holder, share in missing.items():
                        _allocate(stack, holder, agent.uuid, share, "seed", fresh=True)
            agent.baseline = extra
        # Instances the file counts (stats num_instances) but does not list, and those
        # it lists without a flavor: the host runs them (NumInstancesFilter counts them).
        agent.baseline_instances = unsized + max(
            0, int(snap.num("num_instances")[row]) - len(snap.obj("instances")[row]))
        # The file's switches: the reports are deferred, so the one written is the last.
        switches = file_switches(service, now=now, down_time=down_time)
        down_since = None
        if switches is not None:
            agent.take_switches(switches)
            if switches.disabled:
                agent.sync_placement()  # the COMPUTE_STATUS_DISABLED trait
            down_since = switches.down_since
        agent.report(now=down_since if down_since is not None else now)
    stack.builds.adopt(existing, request_id=f"cloud-file:{path}"[:64])


def file_switches(service: Any, *, now: float, down_time: float) -> ServiceSwitches | None:
    """What a host's ``service`` entry of a cloud file (loaded at ``now``) switches on its
    compute service: disabled, forced down, or down (last seen up longer than
    ``down_time`` before ``now``); None when it switches nothing."""
    if service is None:
        return None
    seen = service.last_seen_up
    switches = ServiceSwitches(
        disabled=bool(service.disabled), disabled_reason=service.disabled_reason,
        forced_down=bool(service.forced_down),
        down_since=seen if seen is not None and now - seen > down_time else None)
    if switches.disabled or switches.forced_down or switches.down_since is not None:
        return switches
    return None


def file_services(cloud: Cloud, *, now: float, down_time: float) -> dict[str, ServiceSwitches]:
    """The switches of every host of ``cloud`` (loaded at ``now``) that has any, by host
    (:func:`file_switches`): what ``berth compute --fleet`` sets as each registers."""
    snap = cloud.snapshot
    out = {}
    for row in range(len(snap)):
        switches = file_switches(snap.obj("service")[row], now=now, down_time=down_time)
        if switches is not None:
            out[snap.obj("host")[row]] = switches
    return out


#: The cloud-file field behind each resource class a node reports.
_CLASS_FIELDS = {"VCPU": "vcpus", "PCPU": "pcpus", "MEMORY_MB": "memory_mb",
                 "DISK_GB": "local_gb"}


def check_against_allocations(stack: Any, nodes: Sequence[Any], path: str) -> None:
    """Refuse, before anything is written, a cloud file that would take a resource class
    away from a host whose stored allocations use it (placement refuses such an
    inventory, and the store would be left half re-seeded); warn where a host shrinks
    below what its allocations use (placement allows that: the host is overcommitted
    and takes no more of that class until they shrink)."""
    from berth.service.compute import inventories_for

    stored = {p.uuid for p in stack.client.list_providers()}
    client = stack.agent_client or stack.client  # the store itself in process
    for node in nodes:
        if node.uuid not in stored:
            continue  # a new host
        try:
            usages = client.provider_usages(node.uuid)
        except NotFoundError:
            continue  # deleted meanwhile
        inventory = inventories_for(node, stack.config)
        for rc, used in sorted(usages.items()):
            if not used:
                continue
            name = _CLASS_FIELDS.get(rc, rc)
            inv = inventory.get(rc)
            if inv is None:
                raise CloudFileError(
                    f"{path}: host {node.host}: {name} would leave it no {rc} inventory, but "
                    f"its allocations in the database use {used} {rc}; keep {name} at least "
                    f"{used} or delete those allocations first (nothing was changed)",
                    host=node.host, field=name)
            capacity = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
            if capacity < used:
                LOG.warning("%s: host %s: %s gives %d %s, below the %d its allocations use; "
                            "it takes no more %s until they shrink", path, node.host, name,
                            capacity, rc, used, rc)


#: The most consumers a host's usage beyond its instances is split into (one may hold at
#: most the host's size of each class: a usage many times the host's size means an
#: allocation ratio, or a *_used field, nobody meant).
MAX_USAGE_PARTS = 1024


@contextlib.contextmanager
def _room_for(agent: Any, extra: Flavor, writing: Iterable[Flavor], placed: Sequence[Flavor],
              config: Any, path: str) -> Iterator[None]:
    """Room in placement for a host's usage beyond its instances (``extra``, of which the
    shares ``writing`` are still to be written) when the file gives it more than the
    host's capacity (an allocation ratio lowered since, as Nova's hosts can be): its
    inventory of such a class is raised while the usage is written, then put back as it
    was. Placement keeps allocations above capacity, as Nova's does: no more of that
    class fits until the usage shrinks below it."""
    from berth.service.compute import inventories_for

    wanted = {"VCPU": extra.vcpus, "MEMORY_MB": extra.memory_mb, "DISK_GB": extra.root_gb}
    instances = {"VCPU": sum(f.vcpus for f in placed),
                 "MEMORY_MB": sum(f.memory_mb for f in placed),
                 "DISK_GB": sum(f.root_gb + f.ephemeral_gb for f in placed)}
    reported = inventories_for(agent.node, config)
    if all(not amount or rc not in reported or instances[rc] + amount <= math.floor(
            (reported[rc]["total"] - reported[rc]["reserved"])
            * reported[rc]["allocation_ratio"]) for rc, amount in wanted.items()):
        yield  # the common case, decided without asking placement
        return
    client = agent.client
    generation, inventories = client.get_inventories(agent.uuid)
    usages = client.provider_usages(agent.uuid)
    shares = list(writing)
    written = {"VCPU": sum(f.vcpus for f in shares),
               "MEMORY_MB": sum(f.memory_mb for f in shares),
               "DISK_GB": sum(f.root_gb for f in shares)}
    raised = {}
    for rc, amount in written.items():
        inv = inventories.get(rc)
        if not amount or inv is None:
            continue
        need = usages.get(rc, 0) + amount
        total, reserved, ratio = inv["total"], inv["reserved"], inv["allocation_ratio"]
        if need <= math.floor((total - reserved) * ratio):
            continue
        LOG.warning("%s: host %s: its %s usage is more than its capacity; placement holds "
                    "it over capacity, as after a lower allocation ratio: no more %s fits "
                    "until it shrinks", path, agent.node.host, rc, rc)
        raised[rc] = {**inv, "reserved": 0, "allocation_ratio": math.ceil(need / total) + 1.0}
    if raised:
        client.set_inventories(agent.uuid, generation, {**inventories, **raised})
    try:
        yield
    finally:
        if raised:
            generation, _ = client.get_inventories(agent.uuid)
            client.set_inventories(agent.uuid, generation, inventories)


def _share(total: int, parts: int, index: int) -> int:
    """The ``index``-th of ``parts`` near-equal integer shares of ``total``."""
    return total // parts + (1 if index < total % parts else 0)


#: The classes a plain flavor asks of its host's root provider.
_PLAIN = frozenset({"VCPU", "MEMORY_MB", "DISK_GB"})


def _allocate(stack: Any, consumer: str, rp_uuid: str, flavor: Flavor, project: str, *,
              fresh: bool = False) -> None:
    """Give an existing workload its allocation, unless it has one already.

    A flavor that asks placement for no more than VCPU, MEMORY_MB and DISK_GB takes
    them from the node's root provider. Any other (PCPU, custom classes, granular
    groups) takes the first allocation request placement answers for the flavor's
    resources within the node's tree, so nested and sharing providers hold their part.
    """
    from berth.model.request import RequestSpec
    from berth.resource_request import from_request_spec

    if not fresh and stack.client.get_allocations(consumer).allocations:
        return
    request = from_request_spec(RequestSpec(flavor=flavor))
    groups = [g for g in request.groups.values() if g.resources]
    allocations: dict[str, dict[str, int]] | None
    if len(groups) <= 1 and set(request.unsuffixed.resources) <= _PLAIN:
        resources = {"VCPU": flavor.vcpus, "MEMORY_MB": flavor.memory_mb,
                     "DISK_GB": flavor.root_gb + flavor.ephemeral_gb}
        allocations = {rp_uuid: {k: v for k, v in resources.items() if v}}
    else:
        allocations = _first_candidate(stack, request, rp_uuid)
        if allocations is None:
            LOG.warning("could not seed the allocation of %s: its flavor %s does not fit "
                        "its host's providers", consumer, flavor.name)
            return
    try:
        stack.client.put_allocations(consumer, allocations, project_id=project, user_id="seed",
                                     consumer_generation=None)
    except PlacementAPIError as exc:
        LOG.warning("could not seed the allocation of %s: %s", consumer, one_line(exc.detail))


def _first_candidate(stack: Any, request: Any, rp_uuid: str) -> dict[str, dict[str, int]] | None:
    """The allocations of placement's first candidate for ``request``'s resources (its
    traits and aggregates aside: the instance runs there already) on the node
    ``rp_uuid``: within its tree, else (resources a sharing provider lends it) the first
    candidate of any host that uses the node."""
    for in_tree in (True, False):
        query: dict[str, list[str]] = {}
        for group in request.groups.values():
            if group.resources:
                query[f"resources{group.suffix}"] = [",".join(
                    f"{rc}:{n}" for rc, n in sorted(group.resources.items()))]
                if in_tree:
                    query[f"in_tree{group.suffix}"] = [rp_uuid]
        if request.group_policy is not None:
            query["group_policy"] = [request.group_policy]
        try:
            answer = stack.client.allocation_candidates(query)
        except PlacementAPIError:
            return None
        for candidate in answer.get("allocation_requests") or []:
            if rp_uuid in candidate["allocations"]:
                return {rp: dict(a["resources"]) for rp, a in candidate["allocations"].items()}
    return None
