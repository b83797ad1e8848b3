"""``berth capacity``: how many more instances of each flavor fit, where, and what limits
each host.

Computed on the one path, never by arithmetic alone: the cloud (a cloud file, or a
running Berth read through its API as ``berth cloud export`` reads it: ``berth capacity
--url`` has the server count, ``POST /capacity``, so with the server's configuration) is
registered in a scratch store (:mod:`berth.service.offline`), and for each flavor one multi-create of
more instances than could possibly fit goes through the scheduler service — request
filters, placement's allocation candidates, the enabled filters and weighers, a claim
per instance with virtual consumption, each placed instance counting as built and
running (not as a build holding one of the host's I/O slots) — until the hosts run out. The refusal says how
many instances had found a host and where (:attr:`~berth.errors.NoValidHost.placed`);
their claims are released before the next flavor, so every flavor is answered against
the cloud as it is.

Per flavor: the count (``capped`` when it reached ``limit``, which bounds the run time),
its spread over availability zones, cells and host aggregates, and per host what stops
one more instance afterwards, as the scheduler says it: one more instance is asked for
with an explanation, whose first refusal of each host is
its limit (``placement: insufficient MEMORY_MB``, ``ComputeFilter: compute service
disabled``, ``AvailabilityZoneFilter: ...``), after the fill's allocations are written
back in one transaction. A capped count gets the arithmetic instead: the classes the
fill used up, or ``not full when the count stopped`` for a host it did not fill.

Unusable capacity: the free amount of every resource class on hosts that took no
instance of any flavor asked about (each answered without a cap): capacity no flavor of
the set can use, because another class is exhausted there or the host is out of play.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from berth.errors import InputError, NoValidHost
from berth.hardware.numa import prepare_request
from berth.model.request import RequestSpec
from berth.resource_request import from_request_spec
from berth.service.offline import OfflineCloud

#: The limit of a host that every class would still admit: a filter or policy.
BY_FILTERS = "filters"
#: A host with room for one more when a capped count stopped: what would limit it was
#: not reached.
NOT_REACHED = "not full when the count stopped"
#: Instances a fill may claim per compute node at once, for the choice of the scratch
#: store's medium (:func:`berth.service.offline.scratch`): one flavor's claims are all
#: held until its count is done.
FILL_PER_HOST = 128


@dataclass
class HostRoom:
    """One compute node's free amounts (capacity less usage) per class, as placement
    counts them, and where it sits."""

    host: str
    nodename: str
    free: dict[str, int]
    zone: str
    #: The cell's name (its uuid when the cloud gives it none).
    cell: str
    aggregates: list[str]


@dataclass
class FlavorCapacity:
    """How many more instances of one flavor fit, and where."""

    flavor: str
    fits: int
    capped: bool
    by_zone: dict[str, int] = field(default_factory=dict)
    by_cell: dict[str, int] = field(default_factory=dict)
    by_aggregate: dict[str, int] = field(default_factory=dict)
    #: Hosts by what stops one more instance there after the fill.
    limited_by: dict[str, int] = field(default_factory=dict)
    #: Instances per (host, node) after the fill.
    placed: dict[tuple[str, str], int] = field(default_factory=dict)
    #: What stops one more instance on each (host, node) after the fill.
    limits: dict[tuple[str, str], str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"flavor": self.flavor, "fits": self.fits, "capped": self.capped,
                "by_availability_zone": self.by_zone, "by_cell": self.by_cell,
                "by_aggregate": self.by_aggregate, "hosts_limited_by": self.limited_by,
                "hosts": [{"host": h, "nodename": n, "instances": self.placed.get((h, n), 0),
                           "limited_by": limit}
                          for (h, n), limit in sorted(self.limits.items())]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> FlavorCapacity:
        """From the JSON form (a running Berth's report)."""
        hosts = data.get("hosts", [])
        return cls(data["flavor"], int(data["fits"]), bool(data["capped"]),
                   dict(data.get("by_availability_zone", {})), dict(data.get("by_cell", {})),
                   dict(data.get("by_aggregate", {})), dict(data.get("hosts_limited_by", {})),
                   {(h["host"], h["nodename"]): int(h["instances"]) for h in hosts
                    if h.get("instances")},
                   {(h["host"], h["nodename"]): h["limited_by"] for h in hosts})


@dataclass
class CapacityReport:
    """Every flavor's answer, and the capacity no flavor of the set can use."""

    flavors: list[FlavorCapacity]
    unusable: dict[str, int]
    unusable_hosts: int
    hosts: int

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {"hosts": self.hosts, "flavors": [f.to_dict() for f in self.flavors],
                "unusable": {"computed": not any(f.capped for f in self.flavors),
                             "hosts": self.unusable_hosts, "free": self.unusable}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CapacityReport:
        """From the JSON form (a running Berth's report)."""
        unusable = data.get("unusable", {})
        return cls([FlavorCapacity.from_dict(f) for f in data.get("flavors", [])],
                   dict(unusable.get("free", {})), int(unusable.get("hosts", 0)),
                   int(data.get("hosts", 0)))


def rooms(offline: OfflineCloud) -> list[HostRoom]:
    """Every registered compute node's free amounts, zone, cell and aggregates."""
    cloud, stack = offline.cloud, offline.stack
    default_zone = stack.config.default_availability_zone
    aggs = cloud.snapshot.aggregates
    # The node's whole tree: its nested providers (NUMA cells, devices) hold classes too.
    free_of: dict[str, Counter[str]] = {}
    for p in stack.provider_amounts():
        free = free_of.setdefault(p.root_uuid, Counter())
        for rc, cap in p.capacity.items():
            free[rc] += cap - p.used.get(rc, 0)
    # Cells by name where the cloud names them (a cloud file's ``cells``).
    cell_names = {c.uuid: c.name for c in stack.records.cell_mappings() if c.name}
    out = []
    for agent in stack.agents.values():
        host = agent.node.host
        mine = [a for a in aggs if host in a.hosts]
        zones = [str(a.metadata["availability_zone"]).split(",")[0].strip()
                 for a in mine if "availability_zone" in a.metadata]
        out.append(HostRoom(host, agent.node.nodename or host,
                            dict(free_of.get(agent.uuid, Counter())),
                            zones[0] if zones else default_zone,
                            cell_names.get(agent.node.cell_uuid or "", agent.node.cell_uuid or "-"),
                            sorted(a.name for a in mine)))
    return out


def needs(spec: RequestSpec) -> dict[str, int]:
    """The amounts one instance takes, per class, over all its request groups: what the
    placement query asks (PCPU for dedicated CPUs, ``resources:`` extra specs...)."""
    return {rc: amount for rc, amount in from_request_spec(spec).merged_resources().items()
            if amount > 0}


def bound(room: Sequence[HostRoom], need: dict[str, int]) -> int:
    """More instances than can fit: the sum over hosts of the arithmetic fit over each
    node's whole tree (so never below the real answer), plus one."""
    total = 0
    for r in room:
        fits = [r.free.get(rc, 0) // amount for rc, amount in need.items()]
        total += max(0, min(fits)) if fits else 0
    return total + 1


def flavor_capacity(offline: OfflineCloud, name: str, room: Sequence[HostRoom], *,
                    limit: int, seed: int | None = None, project: str = "capacity",
                    user: str = "capacity") -> FlavorCapacity:
    """How many instances of flavor ``name`` fit now (at most ``limit``), through the
    scheduler service; the claims are released afterwards."""
    cloud, stack = offline.cloud, offline.stack
    def request(num: int) -> RequestSpec:
        spec = RequestSpec(flavor=cloud.flavor(name), project_id=project, user_id=user,
                           num_instances=num)
        prepare_request(spec, stack.config)
        return spec

    need = needs(request(1))
    count = min(bound(room, need), limit) if need else limit
    service = stack.scheduler(seed=seed)
    try:
        # Capacity is a steady state: the instances placed before count as built and
        # running, not as builds holding I/O slots (IoOpsFilter's max_io_ops_per_host).
        decision = service.select_destinations(request(count), return_alternates=False,
                                               builds_in_flight=False)
    except NoValidHost as exc:
        placed = list(exc.placed)
        capped = False
        claimed = list(exc.claimed)
    else:  # the limit fitted: release those claims too
        service.claimer.rollback(decision.instance_uuids)
        placed = [(sels[0].service_host, sels[0].nodename) for sels in decision.selections]
        capped = True
    why = {} if capped else next_refusals(offline, request, claimed, seed)
    return summarize(name, placed, capped, room, need, why)


def next_refusals(offline: OfflineCloud, request: Any, claimed: list[tuple[str, Any]],
                  seed: int | None) -> dict[tuple[str, str], str]:
    """Why each host refuses one more instance once the fill is placed: the fill's
    allocations are written back (one POST /allocations), one more instance is asked
    for with an explanation, and every claim is released. Per (host, node): the first
    step that turned it away (``placement: insufficient MEMORY_MB``, ``ComputeFilter:
    service down``, ...)."""
    from berth.placement.client import ConsumerPost

    stack = offline.stack
    service = stack.scheduler(seed=seed)
    client = stack.claims_client or stack.client
    held = [uuid for uuid, _ in claimed]
    diagnosis = None
    try:
        if claimed:
            client.post_allocations({
                uuid: ConsumerPost(
                    allocations={rp: dict(body.get("resources", {}))
                                 for rp, body in alloc.get("allocations", {}).items()},
                    project_id="capacity", user_id="capacity", consumer_generation=None)
                for uuid, alloc in claimed})
        try:
            extra = service.select_destinations(request(1), return_alternates=False,
                                                explain=True, builds_in_flight=False)
        except NoValidHost as exc:
            diagnosis = exc.diagnosis
        else:  # room left after all (cannot be: the fill ran out): no reasons then
            held += extra.instance_uuids
            return {}
    finally:
        if held:
            service.claimer.rollback(held)
    reasons: dict[tuple[str, str], str] = {}
    if diagnosis is not None and diagnosis.instances:
        for step in diagnosis.instances[-1].steps:
            for r in step.rejections:
                reason = r.reject.reason.removesuffix(" in placement")
                reasons.setdefault((r.host, r.nodename), f"{step.name}: {reason}")
    return reasons


def summarize(name: str, placed: Sequence[tuple[str, str]], capped: bool,
              room: Sequence[HostRoom], need: dict[str, int],
              why: dict[tuple[str, str], str] | None = None) -> FlavorCapacity:
    """Spread and limits of a fill that put instances on ``placed``: per host the step
    that refused one more (``why``), else the classes the fill used up, else
    ``filters`` (or, for a capped fill, :data:`NOT_REACHED`)."""
    per_node = Counter(placed)
    result = FlavorCapacity(name, len(placed), capped, placed=dict(per_node))
    zones: Counter[str] = Counter()
    cells: Counter[str] = Counter()
    aggregates: Counter[str] = Counter()
    limits: Counter[str] = Counter()
    for r in room:
        took = per_node.get((r.host, r.nodename), 0)
        if took:
            zones[r.zone] += took
            cells[r.cell] += took
            for agg in r.aggregates:
                aggregates[agg] += took
        short = [rc for rc, amount in need.items()
                 if r.free.get(rc, 0) - took * amount < amount]
        limit = (why or {}).get((r.host, r.nodename)) or (
            "+".join(short) if short else NOT_REACHED if capped else BY_FILTERS)
        result.limits[(r.host, r.nodename)] = limit
        limits[limit] += 1
    result.by_zone, result.by_cell = dict(sorted(zones.items())), dict(sorted(cells.items()))
    result.by_aggregate = dict(sorted(aggregates.items()))
    result.limited_by = dict(limits.most_common())
    return result


def capacity(offline: OfflineCloud, flavors: Sequence[str] | None = None, *, limit: int,
             seed: int | None = None) -> CapacityReport:
    """Every flavor named (default: the cloud's), and the unusable capacity."""
    cloud = offline.cloud
    names = list(flavors) if flavors else cloud.own_flavors()
    room = rooms(offline)
    answers = [flavor_capacity(offline, name, room, limit=limit, seed=seed) for name in names]
    used: set[tuple[str, str]] = set()
    for answer in answers:
        used.update(answer.placed)
    unusable: Counter[str] = Counter()
    hosts = 0
    if not any(a.capped for a in answers):
        for r in room:
            if (r.host, r.nodename) in used:
                continue
            hosts += 1
            for rc, amount in r.free.items():
                if amount > 0:
                    unusable[rc] += amount
    return CapacityReport(answers, dict(sorted(unusable.items())), hosts, len(room))


@contextmanager
def cloud_of(path: str | None, url: str | None, token: str, config: Any, *,
             now: float, transport: Any = None) -> Iterator[OfflineCloud]:
    """The cloud file at ``path``, or the running Berth at ``url`` (through
    ``transport`` when given: a server reading itself) read as a cloud file,
    registered in a scratch store."""
    import tempfile
    from pathlib import Path

    from berth.service.offline import offline_cloud

    if url is None:
        assert path is not None
        with offline_cloud(path, config, now=now, events_per_host=FILL_PER_HOST) as offline:
            yield offline
        return
    from berth.cloudio.berth_source import BerthAPI, read_berth
    from berth.cloudio.emit import dump, to_document

    api = BerthAPI(url, token=token, transport=transport)
    try:
        state = read_berth(api)
    finally:
        api.close()
    with tempfile.TemporaryDirectory(prefix="berth-capacity-") as tmp:
        exported = str(Path(tmp) / "cloud.json")
        dump(to_document(state, config), exported, "json", header="")
        with offline_cloud(exported, config, now=now, events_per_host=FILL_PER_HOST) as offline:
            yield offline


#: Seconds between two looks at a running Berth's capacity report.
POLL_SECONDS = 0.25


def from_server(url: str, token: str, flavors: Sequence[str], limit: int, *,
                transport: Any = None) -> CapacityReport:
    """The capacity report of a running ``berth serve``, computed there (``POST
    /capacity``, then ``GET /capacity`` until it is ready), so with the server's own
    configuration: the filters, weighers and options it schedules with. A report
    another caller started first is waited for, then ours is started."""
    import time

    import httpx

    from berth.errors import BerthError
    from berth.service.api_client import call_json

    def call(method: str, body: Any = None) -> dict[str, Any]:
        _, data = call_json(http, url, method, "/capacity", body, ok=(200, 202))
        if not isinstance(data, dict):
            raise BerthError(f"{url}: {method} /capacity answered no JSON object")
        return data

    with httpx.Client(base_url=url, headers={"X-Auth-Token": token}, timeout=60,
                      transport=transport) as http:
        while True:
            state = call("POST", {"flavors": list(flavors), "limit": limit})
            if state.get("started"):
                break
            while call("GET").get("status") == "running":  # another caller's report
                time.sleep(POLL_SECONDS)
        ours = state.get("started_at")
        while (state := call("GET")).get("status") == "running":
            time.sleep(POLL_SECONDS)
    if state.get("started_at") != ours:
        raise BerthError(f"{url}: another capacity report replaced this one before it was "
                         "read; ask again")
    if state.get("status") != "ready":
        raise BerthError(f"{url}: the capacity report failed: {state.get('error')}")
    return CapacityReport.from_dict(state["report"])


def prometheus_text(report: CapacityReport) -> str:
    """The report in Prometheus' text exposition format (what os-capacity exports)."""
    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    registry = CollectorRegistry()
    fits = Gauge("berth_capacity_instances", "More instances of the flavor that fit now",
                 ["flavor", "capped"], registry=registry)
    zone = Gauge("berth_capacity_instances_by_zone", "Of those, per availability zone",
                 ["flavor", "availability_zone"], registry=registry)
    cell = Gauge("berth_capacity_instances_by_cell", "Of those, per cell",
                 ["flavor", "cell"], registry=registry)
    agg = Gauge("berth_capacity_instances_by_aggregate", "Of those, per host aggregate",
                ["flavor", "aggregate"], registry=registry)
    limited = Gauge("berth_capacity_hosts_limited", "Hosts by what stops one more instance "
                    "of the flavor after the fill", ["flavor", "limit"], registry=registry)
    unusable = Gauge("berth_capacity_unusable", "Free capacity no flavor of the set can use",
                     ["resource_class"], registry=registry)
    for f in report.flavors:
        fits.labels(f.flavor, str(f.capped).lower()).set(f.fits)
        for key, value in f.by_zone.items():
            zone.labels(f.flavor, key).set(value)
        for key, value in f.by_cell.items():
            cell.labels(f.flavor, key).set(value)
        for key, value in f.by_aggregate.items():
            agg.labels(f.flavor, key).set(value)
        for key, value in f.limited_by.items():
            limited.labels(f.flavor, key).set(value)
    for rc, amount in report.unusable.items():
        unusable.labels(rc).set(amount)
    return generate_latest(registry).decode()


def _short_cell(cell: str) -> str:
    """A cell's name, or the first 8 characters of a cell known by its uuid alone."""
    return cell[:8] if len(cell) == 36 and cell.count("-") == 4 else cell


def table_lines(report: CapacityReport) -> list[str]:
    """The report as a table and notes."""
    lines = [f"{'flavor':<20} {'fits':>8}  by availability zone / cell",
             f"{'-' * 20} {'-' * 8}  {'-' * 40}"]
    for f in report.flavors:
        fits = f">={f.fits}" if f.capped else str(f.fits)
        zones = ", ".join(f"{k} {v}" for k, v in f.by_zone.items()) or "-"
        cells = ", ".join(f"{_short_cell(k)} {v}" for k, v in f.by_cell.items()) or "-"
        lines.append(f"{f.flavor:<20} {fits:>8}  {zones}  |  cells: {cells}")
        lines.append(f"{'':<20} {'':>8}  hosts limited by: "
                     + ", ".join(f"{k} {v}" for k, v in f.limited_by.items()))
    lines.append("")
    if any(f.capped for f in report.flavors):
        lines.append("unusable capacity: not computed (a flavor reached --limit; raise it)")
    elif report.unusable_hosts:
        lines.append(f"unusable capacity (free on {report.unusable_hosts} of {report.hosts} "
                     "hosts where no flavor of the set fits): "
                     + ", ".join(f"{rc} {amount}" for rc, amount in report.unusable.items()))
    else:
        lines.append(f"unusable capacity: none (every one of {report.hosts} hosts takes some "
                     "flavor of the set)")
    return lines



# ----------------------------------------------------------------------------- command
def add_command(sub: Any) -> None:
    """``berth capacity``."""
    from berth.service.cli import instant, positive_int, server_url

    p = sub.add_parser("capacity", help="how many more instances of each flavor fit, where, "
                       "and what limits each host (offline, through the real pipeline)")
    p.add_argument("cloud", nargs="?", help="cloud description (YAML or JSON); or --url")
    p.add_argument("--url", type=server_url,
                   help="a running berth serve to count instead, there, with its own "
                        "configuration (an API process of the distributed form cannot)")
    p.add_argument("--token", default="admin", help="with --url: the X-Auth-Token to send")
    p.add_argument("--flavor", action="append", default=[],
                   help="flavor name (repeatable; default every flavor the cloud defines, "
                        "or Berth's m1.* defaults when it defines none)")
    p.add_argument("--limit", type=positive_int, default=10_000,
                   help="stop counting a flavor here (default 10000): each instance is "
                        "placed by the pipeline, so this bounds the time")
    p.add_argument("--config-file", action="append", help="nova.conf (repeatable)")
    p.add_argument("--seed", type=int, default=None, help="random seed")
    p.add_argument("--now", type=instant, default=None, help="the instant, epoch seconds")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--prometheus", action="store_true",
                     help="print Prometheus' text exposition format")
    p.set_defaults(func=cmd_capacity)


def cmd_capacity(args: Any) -> int:
    """Print the capacity report of a cloud file or a running Berth."""
    import json
    import time

    from berth.cli import _load_config

    if (args.cloud is None) == (args.url is None):
        raise InputError("give a cloud file or --url (one of them)", field="cloud")
    if args.url:
        for option, given in (("--config-file", args.config_file), ("--seed", args.seed),
                              ("--now", args.now)):
            if given is not None:
                raise InputError(f"{option}: a running Berth counts with its own "
                                 "configuration, seed and clock; count a cloud file to "
                                 "choose them", field=option)
        report = from_server(args.url, args.token, args.flavor, args.limit)
    else:
        config = _load_config(args.config_file)
        now = time.time() if args.now is None else args.now
        with cloud_of(args.cloud, None, args.token, config, now=now) as offline:
            for name in args.flavor:
                offline.cloud.flavor(name)  # an unknown flavor: one line naming the known ones
            report = capacity(offline, args.flavor or None, limit=args.limit, seed=args.seed)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    elif args.prometheus:
        print(prometheus_text(report), end="")
    else:
        print("\n".join(table_lines(report)))
    return 0
