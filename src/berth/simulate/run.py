"""The replay: a trace's events, in time order, through a target.

Each create becomes one ``POST /boot`` body (flavor by name, or the trace's own size;
image; ``num``; hints, where ``same_host`` / ``different_host`` may name earlier ids of
the trace; ``hints.group``, the group created on first use with the row's policy when
the cloud has none of that name). Each delete deletes every instance its create built
(a delete of a refused create has nothing to do and is counted as such).

Measured per configuration: instances and requests accepted and refused, the first
refusal, refusals by cause (placement, a request filter, the filter that removed the
last hosts, claims, a build), the time of every create request, and at evenly spaced
instants of the trace (``samples`` of them) the live instances, the compute nodes in use,
the utilization of every resource class, and the fragmentation (largest flavor that
still fits somewhere, stranded capacity) from the :class:`~berth.simulate.ledger.Ledger`.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from berth.errors import InputError
from berth.model.request import Flavor, RequestSpec
from berth.simulate.ledger import Ledger, Need
from berth.simulate.targets import Target
from berth.simulate.trace import CREATE, INSTANCE_HINTS, Event, Trace


@dataclass
class Sample:
    """The cloud at one instant of the trace."""

    time: float
    events: int
    live: int
    hosts_in_use: int
    utilization: dict[str, float]
    accepted: int
    refused: int
    largest_fit: str | None
    stranded: dict[str, int]
    stranded_hosts: int


@dataclass
class RunResult:
    """Everything one configuration's replay measured."""

    label: str
    trace: str
    hosts: int
    events: int = 0
    requests: int = 0
    requests_accepted: int = 0
    instances_requested: int = 0
    instances_accepted: int = 0
    deletes: int = 0
    deletes_of_refused: int = 0
    first_refusal: dict[str, Any] | None = None
    causes: Counter[str] = field(default_factory=Counter)
    request_seconds: list[float] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    wall_seconds: float = 0.0
    classes: list[str] = field(default_factory=list)
    #: Capacity per class over every node (placement's (total - reserved) * ratio).
    capacity: dict[str, int] = field(default_factory=dict)
    #: What the configuration is (its files and the options that matter).
    config_note: str = ""
    #: The highest compute nodes in use and utilization per class at any instant of the
    #: replay (after every event, not only at the samples), and the nodes in use
    #: averaged over the trace's time (weighted by how long each count lasted).
    peak_hosts_in_use: int = 0
    peak_utilization: dict[str, float] = field(default_factory=dict)
    mean_hosts_in_use: float = 0.0

    @property
    def acceptance(self) -> float:
        """Instances built over instances asked for."""
        return self.instances_accepted / self.instances_requested if self.instances_requested else 1.0

    def latency(self) -> dict[str, float]:
        """Create request times in milliseconds: mean, p50, p95, p99, max."""
        if not self.request_seconds:
            return {}
        ms = np.array(self.request_seconds) * 1000.0
        return {"mean": round(float(ms.mean()), 3),
                **{f"p{q}": round(float(np.percentile(ms, q)), 3) for q in (50, 95, 99)},
                "max": round(float(ms.max()), 3)}

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "label": self.label, "configuration": self.config_note, "trace": self.trace,
            "hosts": self.hosts, "capacity": self.capacity,
            "events": self.events, "wall_seconds": round(self.wall_seconds, 3),
            "events_per_second": round(self.events / self.wall_seconds, 1)
            if self.wall_seconds else None,
            "requests": self.requests, "requests_accepted": self.requests_accepted,
            "instances_requested": self.instances_requested,
            "instances_accepted": self.instances_accepted,
            "acceptance": round(self.acceptance, 6),
            "deletes": self.deletes, "deletes_of_refused": self.deletes_of_refused,
            "first_refusal": self.first_refusal,
            "refusals_by_cause": dict(self.causes.most_common()),
            "request_ms": self.latency(),
            "peak": self.peak(),
            "samples": [{"time": s.time, "events": s.events, "live": s.live,
                         "hosts_in_use": s.hosts_in_use,
                         "utilization": {k: round(v, 6) for k, v in s.utilization.items()},
                         "accepted": s.accepted, "refused": s.refused,
                         "largest_fit": s.largest_fit, "stranded": s.stranded,
                         "stranded_hosts": s.stranded_hosts} for s in self.samples],
        }

    def peak(self) -> dict[str, Any]:
        """The highest hosts in use and utilization per class at any instant, and the
        time-weighted mean of the hosts in use (none of them read off the samples)."""
        return {"hosts_in_use": self.peak_hosts_in_use,
                "mean_hosts_in_use": round(self.mean_hosts_in_use, 2),
                "utilization": {rc: round(self.peak_utilization.get(rc, 0.0), 6)
                                for rc in self.classes}}


def needs_of(flavors: Mapping[str, Flavor], config: Any) -> list[Need]:
    """Each flavor's amounts per class, as the placement query asks them."""
    from berth.hardware.numa import prepare_request
    from berth.resource_request import from_request_spec

    out = []
    for name, flavor in sorted(flavors.items()):
        spec = RequestSpec(flavor=flavor, project_id="simulate", user_id="simulate")
        prepare_request(spec, config)
        merged = from_request_spec(spec).merged_resources()
        out.append(Need(name, {rc: a for rc, a in merged.items() if a > 0}))
    return out


class Replay:
    """One trace through one target (see the module's docstring)."""

    def __init__(self, target: Target, trace: Trace, *, config: Any, label: str,
                 samples: int = 200, on_event: Callable[[int], None] | None = None) -> None:
        self.target, self.trace, self.label = target, trace, label
        self.on_event = on_event
        known = target.flavors()
        missing = sorted({e.flavor or "" for e in trace.events if e.kind == CREATE
                          and e.flavor not in known and e.flavor not in trace.flavors})
        if missing:
            raise InputError(f"trace {trace.source}: flavor {missing[0]!r} is neither the "
                             f"cloud's nor the trace's (known: {', '.join(sorted(known))})",
                             field="trace")
        images = target.images()
        bad = sorted({e.image for e in trace.events if e.image and e.image not in images})
        if bad:
            raise InputError(f"trace {trace.source}: image {bad[0]!r} is not the cloud's "
                             f"(known: {', '.join(sorted(images)) or 'none'})", field="trace")
        used = {e.flavor for e in trace.events if e.kind == CREATE}
        flavors = {n: f for n, f in known.items() if n in used}
        flavors.update({n: Flavor(name=n, vcpus=size["vcpus"], memory_mb=size["memory_mb"],
                                  root_gb=size["root_gb"])
                        for n, size in trace.flavors.items() if n in used})
        nodes = target.compute_nodes()
        self.ledger = Ledger(target.provider_amounts(), nodes, needs_of(flavors, config))
        totals = self.ledger.capacity.sum(axis=0)
        self.result = RunResult(label, trace.source, len(self.ledger.roots),
                                classes=list(self.ledger.classes),
                                capacity={rc: int(totals[i])
                                          for i, rc in enumerate(self.ledger.classes)})
        self.samples = max(1, samples)
        self.groups = target.groups()
        #: Trace id -> the instances its create built (uuid, allocations).
        self.live: dict[str, list[tuple[str, dict[str, dict[str, int]]]]] = {}
        self.created: set[str] = set()

    def body(self, e: Event) -> dict[str, Any]:
        """The ``POST /boot`` body of a create."""
        flavor: Any = e.flavor
        if e.flavor in self.trace.flavors:
            flavor = {"name": e.flavor, **self.trace.flavors[e.flavor]}
        hints: dict[str, Any] = {}
        for key, values in e.hints.items():
            if key in INSTANCE_HINTS:
                # An id of the trace stands for its live instances (none once deleted
                # or refused); anything else is taken as an instance uuid.
                values = [u for v in values
                          for u in ([uuid for uuid, _ in self.live.get(v, [])]
                                    if v in self.created else [v])]
                if not values:
                    continue
            hints[key] = values
        if e.group:
            if e.group not in self.groups:
                if e.policy is None:
                    raise InputError(f"trace {self.trace.source}: {e.at()}: group "
                                     f"{e.group!r} is not the cloud's and its first row "
                                     "gives no policy", field="trace")
                self.target.create_group(e.group, e.policy)
                self.groups.add(e.group)
            hints["group"] = e.group
        body: dict[str, Any] = {"flavor": flavor, "num": e.num, "hints": hints,
                                "project_id": e.project or "simulate", "user_id": "simulate"}
        if e.image:
            body["image"] = e.image
        if e.availability_zone:
            body["availability_zone"] = e.availability_zone
        return body

    def sample(self, at: float, index: int) -> None:
        r, ledger = self.result, self.ledger
        largest, stranded, stranded_hosts = ledger.fragmentation()
        r.samples.append(Sample(round(at, 3), index,
                                sum(len(v) for v in self.live.values()),
                                ledger.hosts_in_use(), ledger.utilization(),
                                r.instances_accepted, r.instances_requested - r.instances_accepted,
                                largest, stranded, stranded_hosts))

    def run(self) -> RunResult:
        """Replay every event; the result.

        ``samples`` instants, evenly spaced from the first event's time to the last's:
        each shows the cloud as the events before that instant left it, and the last
        one the cloud after every event."""
        r, events, ledger = self.result, self.trace.events, self.ledger
        start = events[0].time if events else 0.0
        end = events[-1].time if events else 0.0
        step = (end - start) / (self.samples - 1) if end > start and self.samples > 1 else 0.0
        # The k-th instant is start + k * step, not a running sum: a step too small to
        # move a large start time would otherwise never get past it.
        k, next_sample = 0, start
        area, before = 0.0, start  # nodes in use x seconds, up to ``before``
        began = time.perf_counter()
        for index, e in enumerate(events):
            while step and k < self.samples - 1 and e.time >= next_sample:
                self.sample(next_sample, index)
                k += 1
                next_sample = start + k * step
            area += ledger.in_use * (e.time - before)
            before = e.time
            if e.kind == CREATE:
                self.create(e, index)
            else:
                self.delete(e)
            if self.on_event is not None:
                self.on_event(index + 1)
        r.events = len(events)
        self.sample(end, len(events))
        r.peak_hosts_in_use = ledger.peak_in_use
        r.peak_utilization = ledger.peak_utilization()
        r.mean_hosts_in_use = area / (end - start) if end > start else float(ledger.in_use)
        r.wall_seconds = time.perf_counter() - began
        return r

    def create(self, e: Event, index: int) -> None:
        r = self.result
        try:
            outcome = self.target.boot(self.body(e))
        except InputError as exc:  # the request itself is refused: the trace's row is wrong
            raise InputError(f"trace {self.trace.source}: {e.at()}: {exc.message}",
                             field="trace") from None
        self.created.add(e.id)
        r.requests += 1
        r.instances_requested += e.num
        r.request_seconds.append(outcome.seconds)
        built = [(p.uuid, p.allocations) for p in outcome.placed]
        for _, allocations in built:
            self.ledger.apply(allocations, 1)
        if built:
            self.live[e.id] = built
        r.instances_accepted += len(built)
        if outcome.refused:
            r.causes[outcome.cause or "error"] += outcome.refused
            if r.first_refusal is None:
                r.first_refusal = {"time": e.time, "event": index, "id": e.id,
                                   "flavor": e.flavor, "cause": outcome.cause,
                                   "message": outcome.message}
        else:
            r.requests_accepted += 1

    def delete(self, e: Event) -> None:
        r = self.result
        r.deletes += 1
        built = self.live.pop(e.id, None)
        if built is None:
            r.deletes_of_refused += 1
            return
        for uuid, allocations in built:
            self.target.delete(uuid)
            self.ledger.apply(allocations, -1)
