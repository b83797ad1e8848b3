"""Wiring: one database, the Placement store and API, clients, records, services.

:func:`open_stack` opens (and migrates) the database, builds the Placement WSGI app over
it and typed clients that call it in process (``httpx.WSGITransport``) — or over HTTP
when ``placement_url`` is given — plus the compute-record store. Schedulers of an
in-process stack skip the API and call the store directly
(:class:`~berth.placement.local.LocalPlacement`: same semantics, no JSON); compute agents
always go through the client. From a :class:`Stack` come scheduler services, compute
agents and conductors; several processes may each open their own stack on the same
PostgreSQL database.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import httpx

from berth.claims import CANDIDATES_MICROVERSION
from berth.config import SchedulerConfig
from berth.model.aggregate import Aggregate
from berth.placement.client import PlacementClient
from berth.placement.local import LocalPlacement
from berth.request_filters import NetworkLookup
from berth.service.compute import ComputeAgent, ComputeNodeSpec, ComputeRecordStore, SnapshotFeed
from berth.service.conductor import ComputeDriver, Conductor, FakeDriver
from berth.service.placement import PlacementCandidates, PlacementClaimer
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
    agents: dict[str, ComputeAgent] = field(default_factory=dict)

    def scheduler(
        self,
        *,
        seed: int | None = None,
        network_lookup: NetworkLookup | None = None,
        min_compute_version: int | None = None,
    ) -> SchedulerService:
        """A scheduler service with its own snapshot feed and claimer."""
        return SchedulerService(
            self.config, SnapshotFeed(self.records), PlacementCandidates(self.candidates_client),
            PlacementClaimer(self.claims_client or self.client), network_lookup=network_lookup,
            min_compute_version=min_compute_version, seed=seed)

    def agent(self, node: ComputeNodeSpec) -> ComputeAgent:
        """A compute agent for ``node`` (kept in ``agents`` by host name)."""
        agent = ComputeAgent(node, self.client, self.records, self.config)
        self.agents[node.host] = agent
        return agent

    def register_hosts(
        self, nodes: Iterable[ComputeNodeSpec], aggregates: Iterable[Aggregate] = ()
    ) -> list[ComputeAgent]:
        """Store the aggregates, then register every node through its agent."""
        aggs = list(aggregates)
        self.records.set_aggregates(aggs)
        agents = [self.agent(n) for n in nodes]
        for agent in agents:
            agent.register(aggs)
        return agents

    def conductor(self, scheduler: SchedulerService, driver: ComputeDriver | None = None) -> Conductor:
        """A conductor over ``scheduler``; the default driver reports through the agents."""
        return Conductor(scheduler, driver or FakeDriver(agents=self.agents))

    def close(self) -> None:
        """Stop agents, close clients and the engine's pool."""
        for agent in self.agents.values():
            agent.stop()
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
) -> Stack:
    """Open ``db_url`` (migrated on the way) and wire a :class:`Stack` over it.

    ``engine`` (an already prepared SQLAlchemy engine) skips opening and migrating.
    ``through_api`` makes in-process schedulers use the WSGI app too (HTTP semantics
    end to end, for tests of that path).
    """
    from berth.placement.app import make_app
    from berth.placement.db import prepare
    from berth.placement.store import PlacementStore

    config = config or SchedulerConfig.default()
    engine = engine if engine is not None else prepare(db_url)
    store = PlacementStore(engine)
    app = make_app(store)
    claims: PlacementClient | LocalPlacement | None = None
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
    else:
        client = PlacementClient(placement_url)
        cand = PlacementClient(placement_url, microversion=CANDIDATES_MICROVERSION)
    return Stack(config, engine, app, client, cand, ComputeRecordStore(engine), claims_client=claims,
                 store=store)
