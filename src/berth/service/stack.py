"""Wiring: one database, the Placement store and API, clients, records, services.

:func:`open_stack` opens (and migrates) the database, builds the Placement WSGI app over
it and typed clients that call it in process (``httpx.WSGITransport``) — or over HTTP
when ``placement_url`` is given — plus the compute-record and server-group stores. Schedulers of an
in-process stack skip the API and call the store directly
(:class:`~berth.placement.local.LocalPlacement`: same semantics, no JSON); compute agents
always go through the client. From a :class:`Stack` come scheduler services, compute
agents and conductors; several processes may each open their own stack on the same
PostgreSQL database.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from berth.claims import CANDIDATES_MICROVERSION
from berth.config import SchedulerConfig, check_own_services
from berth.model.aggregate import Aggregate
from berth.model.request import CellMapping
from berth.placement import amounts
from berth.placement.amounts import ProviderAmounts
from berth.placement.client import NotFoundError, PlacementClient
from berth.placement.local import LocalPlacement, LocalProviders
from berth.placement.store_records import inventory_dict
from berth.request_filters import NetworkLookup
from berth.service.builds import BuildRecords, instance_uuid_rng
from berth.service.compute import (
    ComputeAgent,
    ComputeNodeSpec,
    HeldProvider,
    agent_key,
    held_provider,
    node_from_record,
)
from berth.service.conductor import ComputeDriver, Conductor, FakeDriver
from berth.service.group_check import GroupPolicyCheck
from berth.service.groups import ServerGroupStore
from berth.service.instances import InstanceStore
from berth.service.moves import MoveService, PlacementMoveClaims
from berth.service.placement import PlacementCandidates, PlacementClaimer
from berth.service.reconcile import DEFAULT_BUILD_TIMEOUT, Reconciler
from berth.service.records import ComputeRecordStore, SnapshotFeed, report_to_record
from berth.service.scheduler import SchedulerService


@dataclass
class Stack:
    """Everything one process needs to schedule through the resource store."""

    config: SchedulerConfig
    engine: Any
    placement_app: Any
    client: PlacementClient
    candidates_client: PlacementClient | LocalPlacement
    records: ComputeRecordStore
    #: The claimer's side: the store in process, or ``client`` when placement is remote.
    claims_client: PlacementClient | LocalPlacement | None = None
    #: The store behind ``placement_app`` (its kept connections close with the stack).
    store: Any = None
    #: Placement is another service (``placement_url``): ``store`` is not what it holds.
    remote_placement: bool = False
    #: Compute agents by :func:`~berth.service.compute.agent_key` (host, or host/node).
    agents: dict[str, ComputeAgent] = field(default_factory=dict)
    #: Server groups (same database); opened over ``engine`` when not given.
    groups: ServerGroupStore = None  # type: ignore[assignment]
    #: The late server-group check every conductor of this stack shares (one lock per
    #: group and one set of builds in flight for the process).
    group_check: GroupPolicyCheck = None  # type: ignore[assignment]
    #: This process's build records (registered as an owner when the stack opens).
    builds: BuildRecords = None  # type: ignore[assignment]
    #: Scheduler services made so far (each draws its own instance uuids).
    schedulers_made: int = 0
    #: Instance uuids its schedulers never draw: a scratch store's copy of a running
    #: cloud, whose seeded uuids its own seeded draws could repeat otherwise.
    taken_uuids: frozenset[str] = frozenset()

    #: What this stack's compute agents write providers through: the store in process
    #: (:class:`~berth.placement.local.LocalProviders`), or ``client`` when placement is
    #: remote or the stack goes through the API end to end.
    agent_client: Any = None
    #: Instances and migrations (same database), for moves; opened when not given.
    instances: InstanceStore = None  # type: ignore[assignment]
    #: The instant agents report at and schedulers decide at (the wall clock; a fixed
    #: instant for offline what-if at a given time).
    clock: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if self.instances is None:
            self.instances = InstanceStore(self.engine)
        if self.groups is None:
            self.groups = ServerGroupStore(self.engine)
        if self.builds is None:
            self.builds = BuildRecords(self.engine)
        if self.group_check is None:
            self.group_check = GroupPolicyCheck(self.groups.placements, self.groups)

    def scheduler(
        self,
        *,
        seed: int | None = None,
        network_lookup: NetworkLookup | None = None,
        min_compute_version: int | None = None,
    ) -> SchedulerService:
        """A scheduler service with its own snapshot feed and claimer.

        Its instance uuids come from ``seed``, this process's start number and the
        service's number in the stack, so a seeded run never re-issues the uuids of an
        earlier run on the same database, nor of another service."""
        index = self.schedulers_made
        self.schedulers_made += 1
        return SchedulerService(
            self.config, SnapshotFeed(self.records), PlacementCandidates(self.candidates_client),
            PlacementClaimer(self.claims_client or self.client), network_lookup=network_lookup,
            min_compute_version=min_compute_version, seed=seed, clock=self.clock,
            uuid_rng=instance_uuid_rng(seed, self.builds.start, index),
            taken_uuids=self.taken_uuids)

    def agent(self, node: ComputeNodeSpec) -> ComputeAgent:
        """A compute agent for ``node`` (kept in ``agents`` under its
        :func:`~berth.service.compute.agent_key`: the host name, or ``host/node`` for a
        node of a multi-node host)."""
        agent = ComputeAgent(node, self.agent_client or self.client, self.records, self.config,
                             clock=self.clock)
        self.agents[agent_key(node.host, node.nodename)] = agent
        return agent

    def register_hosts(
        self, nodes: Iterable[ComputeNodeSpec], aggregates: Iterable[Aggregate] = (),
        cells: Iterable[CellMapping] | None = None,
    ) -> list[ComputeAgent]:
        """Store the aggregates (and the cell mappings, unless None), then register
        every node through its agent. A node stored before (a restart with the same
        cloud) starts from what placement holds of its provider, read for all of them
        at once, and writes only what differs."""
        aggs = list(aggregates)
        self.records.set_aggregates(aggs, cells)
        agents = [self.agent(n) for n in nodes]
        self.records.preload([a.uuid for a in agents])  # each takes over its stored record
        try:
            held = self._published([a.uuid for a in agents
                                    if self.records.report_of(a.uuid) is not None])
            for agent in agents:
                if agent.uuid in held:
                    agent.adopt(held[agent.uuid])
                agent.register(aggs)
        finally:
            self.records.drop_preload()
        return agents

    def resume_agents(self) -> list[ComputeAgent]:
        """Agents for the stored compute nodes that have none in this stack yet, each
        rebuilt from its last record (plus its provider's traits and PCPU total) and
        registered again, taking over its instances and usage. What placement holds of
        the providers is read first (all at once when the store is in process), so a
        registration writes only what differs from it.

        A restarted ``berth serve`` keeps its hosts reporting this way. The service
        state comes back as stored (disabled and its reason, forced down). A node whose
        last heartbeat lags the newest stored one by more than the effective
        ``service_down_time`` was down when the system stopped and stays silent:
        measured against the newest heartbeat rather than the clock, so the time the
        system itself was stopped does not count against every host.
        """
        from berth.filters.compute import effective_service_down_time

        records = [report_to_record(r) for r in self.records.reports()]
        records = [r for r in records
                   if agent_key(r.host, r.nodename) not in self.agents and r.uuid]
        if not records:
            return []
        down_time = effective_service_down_time(self.config.service_down_time,
                                                self.config.report_interval)
        beats = [r.service.last_seen_up for r in records
                 if r.service is not None and r.service.last_seen_up is not None]
        newest = max(beats, default=0.0)
        aggregates = self.records.aggregates()
        published = self._published([r.uuid for r in records if r.uuid is not None])
        agents = []
        for record in records:
            assert record.uuid is not None
            # A provider gone from placement: registration creates it again.
            held = published.get(record.uuid)
            traits = sorted(held.traits) if held is not None else []
            inventory = held.inventory if held is not None else {}
            pcpus = int(inventory.get("PCPU", {}).get("total", 0))
            node = node_from_record(record, traits, pcpus)
            # Classes beyond the node's size (custom ones, VGPU...) stay as published.
            node.resources = {rc: dict(inv) for rc, inv in inventory.items()
                              if rc not in ("VCPU", "PCPU", "MEMORY_MB", "DISK_GB")}
            agent = self.agent(node)
            if held is not None:
                agent.adopt(held)
            service = record.service
            if service is not None:
                agent.disabled = service.disabled
                agent.disabled_reason = service.disabled_reason if service.disabled else None
                agent.forced_down = service.forced_down
                if service.created_at is not None:
                    agent.created_at = service.created_at
            beat = service.last_seen_up if service is not None else None
            agent.silent = beat is None or newest - beat > down_time
            agents.append(agent)
        # One wave, as register_hosts: each agent takes over its stored record.
        self.records.preload([a.uuid for a in agents])
        try:
            for agent in agents:
                agent.register(aggregates)
        finally:
            self.records.drop_preload()
        return agents

    @property
    def placement_store(self) -> Any:
        """The store placement's answers come from, when it is in this process (for
        whole-cloud readings without a request per provider); None when remote."""
        return None if self.remote_placement else self.store

    def provider_amounts(self) -> list[ProviderAmounts]:
        """Every provider's capacity and usage (a replay's ledger, ``berth capacity``):
        from the store's provider graph at once when placement is in process, else
        through its API."""
        store = self.placement_store
        return amounts.over_api(self.client) if store is None else amounts.from_store(store)

    def _published(self, uuids: list[str]) -> dict[str, HeldProvider]:
        """What placement holds of each provider of ``uuids`` that exists: from the
        store's provider graph in one read when the store is in process, else four
        requests a provider."""
        out: dict[str, HeldProvider] = {}
        store = self.placement_store
        if not uuids:
            return out  # a new cloud: nothing to read (nor a graph to build)
        if store is not None:
            graph = store.provider_graph()
            for uuid in uuids:
                i = graph.index.get(uuid)
                if i is not None:
                    p = graph.providers[i]
                    out[uuid] = HeldProvider(
                        {rc: inventory_dict(inv) for rc, inv in p.inventories.items()},
                        frozenset(p.traits), frozenset(p.aggregates),
                        {rc: int(n) for rc, n in p.usages.items()})
            return out
        for uuid in uuids:
            held = held_provider(self.client, uuid)
            if held is not None:
                out[uuid] = held
        return out

    def conductor(self, scheduler: SchedulerService, driver: ComputeDriver | None = None) -> Conductor:
        """A conductor over ``scheduler``, recording builds in ``builds`` and group
        members in ``groups`` and sharing ``group_check``; the default driver reports
        through the agents."""
        return Conductor(scheduler, driver or FakeDriver(agents=self.agents),
                         groups=self.groups, group_check=self.group_check, builds=self.builds,
                         instances=self.instances)

    def reconciler(self, *, timeout: float | None = None,
                   interval: float | None = None) -> Reconciler:
        """A reconciler for this process (not started): its build heartbeat, and the
        release of claims and group members of builds that crashed processes
        abandoned (see :mod:`berth.service.reconcile`)."""
        return Reconciler(self.builds, self.groups, self.claims_client or self.client,
                          timeout=DEFAULT_BUILD_TIMEOUT if timeout is None else timeout,
                          interval=interval, instances=self.instances)

    def moves(self, conductor: Conductor) -> MoveService:
        """Move operations over ``conductor`` (its scheduler, claimer and driver), with
        this stack's instances, server groups and placement (over a conductor whose
        scheduler runs elsewhere: the instances listed, shown and deleted; no moves)."""
        client = self.claims_client or self.client

        def traits_of(provider: str) -> list[str]:
            try:
                return self.client.get_provider_traits(provider)[1]
            except NotFoundError:
                return []

        return MoveService(conductor, self.instances, PlacementMoveClaims(client),
                           groups=self.groups, traits_of=traits_of,
                           node_names=self.records.node_names)

    def close(self) -> None:
        """Close clients and the engine's pool."""
        self.client.close()
        self.candidates_client.close()
        self.records.close()
        if self.store is not None:
            self.store.close()
        self.engine.dispose()


def open_stack(
    db_url: str,
    config: SchedulerConfig | None = None,
    *,
    placement_url: str | None = None,
    engine: Any = None,
    through_api: bool = False,
    security: Any = None,
    durable: bool = True,
) -> Stack:
    """Open ``db_url`` (migrated on the way) and wire a :class:`Stack` over it.

    ``engine`` (an already prepared SQLAlchemy engine) skips opening and migrating.
    ``through_api`` makes in-process schedulers use the WSGI app too (HTTP semantics
    end to end, for tests of that path). ``security`` (:class:`berth.webauth.settings.Security`)
    protects the Placement app the stack serves (``stack.placement_app``); the stack's
    own in-process clients use an app of their own over the same store. ``durable``
    false: a scratch SQLite store whose commits need not reach the disk.
    """
    from berth.placement.app import make_app
    from berth.placement.db import prepare
    from berth.placement.store import PlacementStore

    config = config or SchedulerConfig.default()
    check_own_services(config)
    engine = engine if engine is not None else prepare(db_url, durable=durable)
    store = PlacementStore(engine)
    app = make_app(store)
    served = make_app(store, security=security) if security is not None else app
    claims: PlacementClient | LocalPlacement | None = None
    agents: LocalProviders | None = None
    cand: PlacementClient | LocalPlacement
    if placement_url is None:
        base = "http://placement.local"
        client = PlacementClient(base, transport=httpx.WSGITransport(app=app))
        if through_api:
            cand = PlacementClient(base, microversion=CANDIDATES_MICROVERSION,
                                   transport=httpx.WSGITransport(app=app))
        else:
            cand = LocalPlacement(store, microversion=CANDIDATES_MICROVERSION)
            claims = LocalPlacement(store)
            agents = LocalProviders(store)
    else:
        client = PlacementClient(placement_url)
        cand = PlacementClient(placement_url, microversion=CANDIDATES_MICROVERSION)
    return Stack(config, engine, served, client, cand, ComputeRecordStore(engine), claims_client=claims,
                 store=store, agent_client=agents, remote_placement=placement_url is not None)
