"""The scheduler over the bus: the scheduler process's RPC endpoint and its client.

Every ``berth scheduler`` process serves topic ``scheduler`` (reference
``nova-scheduler-rpc.md`` §1.1: calls round-robin among the processes, casts to the
``scheduler`` fanout reach them all):

* ``select_destinations(spec, instance_uuids, return_alternates, explain)`` — a call;
  the answer is the decision (per instance the chosen host and its alternates, each
  with its allocation request; the chosen hosts already claimed), or an
  ``{"error": ...}`` answer (NoValidHost with its diagnosis, a bad request);
* ``update_host_states(reports_json)`` — fanout cast from the compute agents (the
  reports as one JSON string; ``reports``, a list, from agents of earlier versions)
  (:mod:`berth.service.reports`);
* ``host_heartbeats(beats)`` — fanout cast: node uuid -> heartbeat, for hosts whose
  state is the one they last reported;
* ``hosts_deleted(uuids, deleted_at)`` — fanout cast: these compute nodes' service was
  deleted (``DELETE /os-services/{host}``); their rows go;
* ``update_aggregates()`` — fanout cast: the host aggregates changed in the database
  (Nova's cast of the same name carries the aggregates; Berth's say where to read);
* ``hosts()`` — a call: ``GET /hosts`` as this scheduler sees the hosts.

A server group arrives with its members' hosts filled in by the API process, from
the claims in the shared database (Nova conductor's ``setup_instance_group``).

:class:`RemoteScheduler` is the caller's side, with the in-process service's interface
(:class:`~berth.service.conductor.SchedulerAPI`), so the conductor and the HTTP API do
not know where the scheduler runs. A call that gets no answer in time
(:class:`~berth.service.bus.BusTimeout`: the process died, or the broker went away)
raises; the conductor then releases whatever the lost call may have claimed.
"""

from __future__ import annotations

import logging
import random
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from berth.config import SchedulerConfig
from berth.errors import BerthError, NoValidHost
from berth.hardware.numa import prepare_request
from berth.model.request import RequestSpec, new_instance_uuids
from berth.pipeline import Decision
from berth.service.bus import Bus, BusTimeout
from berth.service.placement import PlacementClaimer
from berth.service.reports import BusFeed, received_reports
from berth.service.scheduler import SchedulerService
from berth.service.wire import (
    decision_from_wire,
    decision_to_wire,
    error_from_wire,
    error_to_wire,
    spec_from_wire,
    spec_to_wire,
)

LOG = logging.getLogger(__name__)

SCHEDULER_TOPIC = "scheduler"


class SchedulerEndpoint:
    """The RPC methods of one scheduler process."""

    def __init__(self, service: SchedulerService, feed: BusFeed, *,
                 warm_timeout: float = 60.0) -> None:
        self.service = service
        self.feed = feed
        #: Set once the snapshot is warm; calls that come earlier wait for it.
        self.ready = threading.Event()
        self.warm_timeout = warm_timeout

    def select_destinations(self, ctxt: Any, spec: dict[str, Any], instance_uuids: list[str],
                            return_alternates: bool = True,
                            explain: bool = False) -> dict[str, Any]:
        """Schedule and claim; the decision, or an error answer."""
        from berth.service.api import refusal_diagnosis

        if not self.ready.wait(self.warm_timeout):
            return error_to_wire(BusTimeout("this scheduler is still loading its hosts"))
        try:
            request = spec_from_wire(spec)
            prepare_request(request, self.service.config)  # NUMA and PCI, as the API did
            decision = self.service.select_destinations(
                request, instance_uuids, return_alternates=return_alternates, explain=explain)
        except NoValidHost as exc:
            if explain and exc.diagnosis is None:
                exc.diagnosis = refusal_diagnosis(self.service)
            return error_to_wire(exc)
        except BerthError as exc:
            return error_to_wire(exc)
        except (KeyError, TypeError, ValueError) as exc:
            LOG.exception("malformed select_destinations call")
            return error_to_wire(BerthError(f"malformed select_destinations call: {exc}"))
        return decision_to_wire(decision)

    def update_host_states(self, ctxt: Any, reports: list[dict[str, Any]] | None = None,
                           reports_json: str | None = None) -> None:
        """Queue host reports for the snapshot."""
        try:
            self.feed.receive(received_reports(reports, reports_json))
        except ValueError as exc:  # orjson's errors are ValueErrors too
            LOG.error("malformed update_host_states cast dropped: %s", exc)

    def host_heartbeats(self, ctxt: Any, beats: dict[str, float]) -> None:
        """Queue heartbeats of hosts whose state did not change."""
        if not isinstance(beats, dict):
            LOG.error("malformed host_heartbeats cast dropped: beats is not an object")
            return
        self.feed.receive_beats(beats)

    def update_aggregates(self, ctxt: Any) -> None:
        """Re-read the aggregates before the next request."""
        self.feed.aggregates_changed()

    def hosts_deleted(self, ctxt: Any, uuids: list[str], deleted_at: float) -> None:
        """Drop the rows of compute nodes whose service was deleted."""
        try:
            at = float(deleted_at)
            if not isinstance(uuids, list) or not all(isinstance(u, str) for u in uuids):
                raise ValueError("uuids is not a list of strings")
        except (TypeError, ValueError) as exc:
            LOG.error("malformed hosts_deleted cast dropped: %s", exc)
            return
        self.feed.receive_deleted(uuids, at)

    def hosts(self, ctxt: Any) -> dict[str, Any]:
        """Every host as this scheduler sees it (``GET /hosts``)."""
        from berth.service.api import hosts_answer

        return hosts_answer(self.service)


class RemoteScheduler:
    """Scheduler processes, called over the bus, behind the in-process interface.

    ``claimer`` is the caller's own (the conductor releases and claims alternates
    through it). Instance uuids come from ``uuid_rng``
    (:func:`~berth.service.builds.instance_uuid_rng`: never re-issued), random without.
    """

    def __init__(self, bus: Bus, config: SchedulerConfig, claimer: PlacementClaimer, *,
                 uuid_rng: random.Random | None = None, timeout: float | None = None) -> None:
        self.bus = bus
        self.config = config
        self.claimer = claimer
        self.client = bus.client(SCHEDULER_TOPIC, timeout=timeout)
        self.rng: random.Random = uuid_rng or random.SystemRandom()

    def new_instance_uuids(self, count: int) -> list[str]:
        """``count`` new instance uuids."""
        return new_instance_uuids(self.rng, count)

    def select_destinations(self, spec: RequestSpec, instance_uuids: Sequence[str] | None = None,
                            *, return_alternates: bool = True, explain: bool = False) -> Decision:
        """Ask one scheduler process; its decision, or its error raised here."""
        if instance_uuids is None:
            instance_uuids = self.new_instance_uuids(spec.num_instances)
        answer = self.client.call("select_destinations", spec=spec_to_wire(spec),
                                  instance_uuids=list(instance_uuids),
                                  return_alternates=return_alternates, explain=explain)
        if isinstance(answer, Mapping) and "error" in answer:
            raise error_from_wire(answer)
        return decision_from_wire(answer)

    def hosts(self) -> dict[str, Any]:
        """``GET /hosts`` as one scheduler process sees the hosts."""
        return dict(self.client.call("hosts"))
