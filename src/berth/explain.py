"""Explanations: which filter removed which host and why, and the weight breakdown.

The pipeline fills an :class:`InstanceDiagnosis` per instance when asked to explain. The
summary line reads like kube-scheduler's:
``0/12 hosts available: 7 insufficient RAM (requested 4096 MB), 5 not in availability zone``.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from berth.filters.base import Reject


@dataclass(frozen=True)
class HostRejection:
    """One host removed by one step (a filter, a pre-filter or placement)."""

    host: str
    nodename: str
    step: str
    reject: Reject


@dataclass
class FilterStep:
    """One step of the filter chain for one instance: how many hosts went in and out."""

    name: str
    hosts_in: int
    hosts_out: int
    rejections: list[HostRejection] = field(default_factory=list)
    skipped: str | None = None  # why the step did not run (once-per-request, rebuild, forced)


@dataclass(frozen=True)
class WeigherTerm:
    """One weigher's part of one host's weight."""

    weigher: str
    raw: float
    normalized: float
    multiplier: float

    @property
    def contribution(self) -> float:
        """``multiplier * normalized``: what this weigher adds to the host's weight."""
        return self.multiplier * self.normalized


@dataclass
class HostWeighing:
    """The weight of one of the top hosts, term by term."""

    host: str
    nodename: str
    weight: float
    terms: list[WeigherTerm] = field(default_factory=list)


@dataclass
class RandomPick:
    """The first host was drawn at random among the ``among`` best (Nova's
    ``host_subset_size``, widened to the hosts tied for the best weight when
    ``shuffle_best_same_weighed_hosts`` is on): which host ranked best, and whether
    the pick weighs less than it."""

    among: int
    subset_size: int
    best: tuple[str, str]
    best_weight: float
    picked_weight: float

    @property
    def lower(self) -> bool:
        """The pick weighs less than the best host (not merely tied with it)."""
        return self.picked_weight < self.best_weight

    def to_dict(self) -> dict[str, Any]:
        return {"among": self.among, "host_subset_size": self.subset_size,
                "best": list(self.best), "best_weight": self.best_weight,
                "picked_weight": self.picked_weight, "lower_weighted": self.lower}

    def line(self, picked: tuple[str, str] | None, by_cost: bool) -> str:
        """One line of the explanation."""
        what = "cost" if by_cost else "weight"
        sign = -1.0 if by_cost else 1.0
        where = (f"host_subset_size = {self.subset_size}" if self.among <= self.subset_size
                 else f"{self.among} hosts tied for the best {what}")
        chosen = node_label(*picked) if picked else "the host"
        if self.lower:
            return (f"  random pick ({where}): {chosen} ({what} {sign * self.picked_weight:.4g})"
                    f" was drawn among the {self.among} best, not the best-ranked "
                    f"{node_label(*self.best)} ({what} {sign * self.best_weight:.4g})")
        return f"  random pick ({where}): {chosen} was drawn among the {self.among} best"


@dataclass
class InstanceDiagnosis:
    """Everything that happened while choosing a host for one instance of the request."""

    index: int
    instance_uuid: str | None
    hosts_considered: int = 0
    steps: list[FilterStep] = field(default_factory=list)
    weighing: list[HostWeighing] = field(default_factory=list)
    chosen: tuple[str, str] | None = None
    #: Hosts whose claim placement refused: (host, node, why — None when not known).
    claim_failures: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: Hosts not asked again: placement refused their claim for capacity for an earlier
    #: instance of the request, which only adds usage (host, node, why).
    full_hosts: list[tuple[str, str, str | None]] = field(default_factory=list)
    #: "weight" (weighers: higher is better) or "cost" (least-cost functions: lower is
    #: better; a host's cost is minus its ranking weight, its terms the cost shares).
    ranked_by: str = "weight"
    #: When the host was picked at random among several (``host_subset_size`` > 1, or
    #: hosts tied for the best weight with ``shuffle_best_same_weighed_hosts``).
    random_pick: RandomPick | None = None

    @property
    def hosts_available(self) -> int:
        """Hosts left after the last step."""
        return self.steps[-1].hosts_out if self.steps else self.hosts_considered

    def reason_counts(self) -> list[tuple[str, int]]:
        """``(rendered reason, count)`` over every rejection, most frequent first.

        Numbers shared by every host with the same reason (the request's side, such as
        ``requested_mb``) are shown; per-host numbers are left to :meth:`details`.
        """
        groups: dict[str, list[Reject]] = {}
        for step in self.steps:
            for rejection in step.rejections:
                groups.setdefault(rejection.reject.reason, []).append(rejection.reject)
        counted: Counter[str] = Counter()
        for rejects in groups.values():
            common = [
                key
                for key, value in rejects[0].numbers.items()
                if all(r.numbers.get(key) == value for r in rejects[1:])
            ]
            counted[rejects[0].render(common)] += len(rejects)
        return sorted(counted.items(), key=lambda item: (-item[1], item[0]))

    def summary(self) -> str:
        """``N/M hosts available: 7 insufficient RAM (requested 4096 MB), ...``; when
        hosts were left but none could be claimed, why."""
        head = f"{self.hosts_available}/{self.hosts_considered} hosts available"
        reasons = ", ".join(f"{count} {text}" for text, count in self.reason_counts())
        if self.chosen is None and self.hosts_available and (
                self.claim_failures or self.full_hosts):
            parts = []
            if self.claim_failures:
                parts.append(f"{len(self.claim_failures)} refused the claim")
            if self.full_hosts:
                parts.append(f"{len(self.full_hosts)} full from earlier instances of "
                             "this request")
            head += f", none claimable ({', '.join(parts)})"
        return f"{head}: {reasons}" if reasons else head

    def details(self) -> list[str]:
        """One line per rejected host: host/node, step and the reason with its numbers."""
        lines = []
        for step in self.steps:
            for r in step.rejections:
                lines.append(f"{r.host}/{r.nodename}: {r.step}: {r.reject.render()}")
        return lines

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {
            "index": self.index,
            "instance_uuid": self.instance_uuid,
            "summary": self.summary(),
            "hosts_considered": self.hosts_considered,
            "hosts_available": self.hosts_available,
            "chosen": list(self.chosen) if self.chosen else None,
            "claim_failures": [list(c) for c in self.claim_failures],
            "full_hosts": [list(c) for c in self.full_hosts],
            "ranked_by": self.ranked_by,
            **({"random_pick": self.random_pick.to_dict()} if self.random_pick else {}),
            "steps": [
                {
                    "name": s.name,
                    "hosts_in": s.hosts_in,
                    "hosts_out": s.hosts_out,
                    "skipped": s.skipped,
                    "rejections": [
                        {
                            "host": r.host,
                            "nodename": r.nodename,
                            "reason": r.reject.reason,
                            "numbers": r.reject.numbers,
                        }
                        for r in s.rejections
                    ],
                }
                for s in self.steps
            ],
            "weighing": [
                {
                    "host": w.host,
                    "nodename": w.nodename,
                    "weight": w.weight,
                    **({"cost": -w.weight} if self.ranked_by == "cost" else {}),
                    "terms": [
                        {
                            "weigher": t.weigher,
                            "raw": t.raw,
                            "normalized": t.normalized,
                            "multiplier": t.multiplier,
                            "contribution": t.contribution,
                        }
                        for t in w.terms
                    ],
                }
                for w in self.weighing
            ],
        }


@dataclass
class Diagnosis:
    """The explanation of a whole request: one entry per instance attempted."""

    instances: list[InstanceDiagnosis] = field(default_factory=list)

    def summary(self) -> str:
        """The summary of the instance that failed, or of the first one."""
        if not self.instances:
            return "no hosts considered"
        failed = [d for d in self.instances if d.chosen is None]
        return (failed[0] if failed else self.instances[0]).summary()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready form."""
        return {"summary": self.summary(), "instances": [d.to_dict() for d in self.instances]}


def node_label(host: str, nodename: str | None) -> str:
    """``host`` for a node named like its service host, else ``host/node`` (the nodes of
    a multi-node host, such as Ironic's, would otherwise read alike)."""
    return host if not nodename or nodename == host else f"{host}/{nodename}"


def diagnosis_lines(diagnosis: Diagnosis, *, verbose: bool = False) -> list[str]:
    """The explanation as ``berth schedule --explain`` prints it: per instance a summary,
    each step's hosts in -> out with the first rejections (all with ``verbose``), and a
    table of the best hosts' weights by weigher (each term spelled out with ``verbose``)."""
    lines: list[str] = []
    for inst in diagnosis.instances:
        chosen = f" -> {node_label(*inst.chosen)}" if inst.chosen else " -> no host"
        lines.append(f"instance {inst.index + 1}{chosen}: {inst.summary()}")
        for step in inst.steps:
            note = f" (skipped: {step.skipped})" if step.skipped else ""
            lines.append(f"  {step.name:<36} {step.hosts_in:>6} -> {step.hosts_out:<6}{note}")
            rejected = step.rejections if verbose else step.rejections[:3]
            for r in rejected:
                lines.append(f"      {r.host}/{r.nodename}: {r.reject.render()}")
            if len(step.rejections) > len(rejected):
                lines.append(f"      ... {len(step.rejections) - len(rejected)} more (--verbose)")
        if inst.claim_failures:
            lines.append("  claims refused on: " + ", ".join(
                node_label(h, n) + (f" ({why})" if why else "")
                for h, n, why in inst.claim_failures))
        if inst.full_hosts and inst.chosen is None:
            lines.append("  not asked again (their claims were refused for earlier instances "
                         "of this request): " + ", ".join(
                             node_label(h, n) + (f" ({why})" if why else "")
                             for h, n, why in inst.full_hosts))
        if inst.random_pick is not None:
            lines.append(inst.random_pick.line(inst.chosen, inst.ranked_by == "cost"))
        if inst.weighing:
            lines.extend(_weighing_lines(inst, verbose))
    return lines


def _weighing_lines(inst: InstanceDiagnosis, verbose: bool) -> list[str]:
    """The table of the best hosts: by weight and weigher (higher is better), or, for a
    least-cost ranking, by cost and cost function with seed 001's signs (lower is
    better: ``cost = Σ weight × function``)."""
    by_cost = inst.ranked_by == "cost"
    lines: list[str] = []
    # Only weighers that change something for the hosts shown get a column.
    names = [t.weigher for t in inst.weighing[0].terms]
    shown = [i for i, _ in enumerate(names)
             if any(w.terms[i].contribution != 0 for w in inst.weighing)]
    quiet = len(names) - len(shown)
    if by_cost:
        lines.append("  top hosts by cost (lower is better; cost = sum of weight x function)"
                     + (f" ({quiet} functions add 0 here):" if quiet else ":"))
    else:
        lines.append("  top hosts by weight"
                     + (f" ({quiet} weighers add 0 here):" if quiet else ":"))
    rows: list[tuple[str, ...]] = [("host", "cost" if by_cost else "weight") + tuple(
        names[i].replace("Weigher", "").replace("ServerGroup", "") for i in shown)]
    # Best first (a random pick tried another host first: its line above says so).
    ranked = sorted(inst.weighing, key=lambda w: -w.weight if w.weight == w.weight else math.inf)
    for w in ranked:
        total = -w.weight if by_cost else w.weight
        rows.append((node_label(w.host, w.nodename), f"{total + 0.0:.4f}") + tuple(
            f"{w.terms[i].contribution:+.3f}" for i in shown))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        lines.append("    " + "  ".join(c.ljust(wd) for c, wd in zip(row, widths)).rstrip())
    if verbose:
        for w in ranked:
            label = node_label(w.host, w.nodename)
            for t in w.terms:
                if by_cost:
                    lines.append(f"    {label} {t.weigher}: value {t.raw:g} x weight "
                                 f"{t.multiplier:g} = cost {t.contribution:+.4f}")
                else:
                    lines.append(
                        f"    {label} {t.weigher}: raw {t.raw:g}, normalized "
                        f"{t.normalized:.4f} x multiplier {t.multiplier:g} = "
                        f"{t.contribution:+.4f}")
    return lines
