"""``berth trace generate``: a synthetic workload, seeded.

Arrivals form a Poisson process (exponential gaps at ``rate`` creates per second); each
instance lives for a time drawn from the lifetime distribution and is deleted then,
unless that falls after the end of the trace (it is still running at the end). The
flavor of each create is drawn from the mix; a fraction of creates join one of a few
server groups of a given policy.

Lifetimes: ``exp:MEAN`` (exponential), ``lognormal:MEDIAN,SIGMA``, ``uniform:LOW,HIGH``,
``fixed:SECONDS``. The same arguments and seed give the same trace, byte for byte.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from berth.errors import InputError
from berth.model.request import InstanceGroup
from berth.simulate.trace import CREATE, DELETE, Event, Trace

#: The most creates one trace may have (``--creates``): each is an event held in memory
#: and a row written, and a replay of more would take days anyway.
MAX_CREATES = 10_000_000


@dataclass(frozen=True)
class Lifetime:
    """A lifetime distribution, parsed from ``KIND:PARAMS``."""

    kind: str
    params: tuple[float, ...]

    KINDS = {"exp": 1, "lognormal": 2, "uniform": 2, "fixed": 1}

    @classmethod
    def parse(cls, text: str) -> Lifetime:
        kind, _, rest = text.partition(":")
        want = cls.KINDS.get(kind)
        try:
            params = tuple(float(p) for p in rest.split(",")) if rest else ()
        except ValueError:
            params = ()
        if (want is None or len(params) != want
                or not all(math.isfinite(p) and p >= 0 for p in params)
                or (kind in ("exp", "lognormal") and params[0] <= 0)
                or (kind == "uniform" and params[0] > params[1])):
            raise InputError(f"--lifetime: expected exp:MEAN, lognormal:MEDIAN,SIGMA, "
                             f"uniform:LOW,HIGH or fixed:SECONDS (MEAN and MEDIAN > 0, the "
                             f"others >= 0, LOW <= HIGH), got {text!r}", field="--lifetime")
        return cls(kind, params)

    def sampler(self, rng: random.Random) -> Callable[[], float]:
        """A function drawing one lifetime in seconds (``inf`` for one too long for a
        float: it outlives any trace)."""
        draw = self._sampler(rng)

        def sample() -> float:
            try:
                return draw()
            except OverflowError:  # lognormal's exp() of a huge draw
                return math.inf
        return sample

    def _sampler(self, rng: random.Random) -> Callable[[], float]:
        p = self.params
        if self.kind == "exp":
            return lambda: rng.expovariate(1.0 / p[0])
        if self.kind == "lognormal":
            mu = math.log(p[0])
            return lambda: rng.lognormvariate(mu, p[1])
        if self.kind == "uniform":
            return lambda: rng.uniform(p[0], p[1])
        return lambda: p[0]


def parse_mix(text: str) -> dict[str, float]:
    """``m1.small=5,m1.large=1`` (a bare name weighs 1)."""
    mix: dict[str, float] = {}
    for part in text.split(","):
        name, _, weight = part.strip().partition("=")
        try:
            w = float(weight) if weight else 1.0
        except ValueError:
            w = -1.0
        if not name or not math.isfinite(w) or w <= 0:
            raise InputError(f"--flavor-mix: expected NAME[=WEIGHT],... with weights > 0, "
                             f"got {part.strip()!r}", field="--flavor-mix")
        if name in mix:
            raise InputError(f"--flavor-mix: flavor {name!r} named twice", field="--flavor-mix")
        mix[name] = w
    return mix


@dataclass(frozen=True)
class GroupSpec:
    """How many creates join server groups, and of what kind."""

    fraction: float = 0.0
    groups: int = 4
    policy: str = "anti-affinity"

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise InputError(f"--group-fraction: expected 0 to 1, got {self.fraction}",
                             field="--group-fraction")
        if self.groups < 1:
            raise InputError(f"--groups: expected >= 1, got {self.groups}", field="--groups")
        if self.policy not in InstanceGroup.VALID_POLICIES:
            raise InputError(f"--group-policy: expected one of "
                             f"{', '.join(InstanceGroup.VALID_POLICIES)}, got {self.policy!r}",
                             field="--group-policy")


def generate(*, creates: int, rate: float, lifetime: Lifetime, mix: Mapping[str, float],
             seed: int = 0, groups: GroupSpec | None = None, image: str | None = None,
             duration: float | None = None) -> Trace:
    """``creates`` arrivals at ``rate`` per second (the trace ends at the last arrival,
    or at ``duration`` seconds if given), with their deletes."""
    if not 1 <= creates <= MAX_CREATES:
        raise InputError(f"--creates: expected 1 to {MAX_CREATES:,}, got {creates}",
                         field="--creates")
    if not (math.isfinite(rate) and rate > 0):
        raise InputError(f"--rate: expected creates per second > 0, got {rate}", field="--rate")
    if not math.isfinite(1.0 / rate):
        raise InputError(f"--rate: {rate} creates per second is too low (the mean time "
                         "between creates is not a finite number of seconds)", field="--rate")
    if duration is not None and not (math.isfinite(duration) and duration > 0):
        raise InputError(f"--duration: expected seconds > 0, got {duration}",
                         field="--duration")
    if not mix:
        raise InputError("--flavor-mix: no flavor given", field="--flavor-mix")
    groups = groups or GroupSpec()
    rng = random.Random(seed)
    life = lifetime.sampler(rng)
    names, weights = list(mix), list(mix.values())
    arrivals: list[Event] = []
    now = 0.0
    for i in range(creates):
        now += rng.expovariate(rate)
        if not math.isfinite(now):
            raise InputError(f"--rate: {rate} creates per second is too low: the arrival "
                             f"of create {i + 1} is past the largest time a float holds",
                             field="--rate")
        if duration is not None and now > duration:
            break
        group = policy = None
        if groups.fraction and rng.random() < groups.fraction:
            group = f"group-{rng.randrange(groups.groups)}"
            policy = groups.policy
        arrivals.append(Event(round(now, 3), CREATE, f"vm-{i}",
                              flavor=rng.choices(names, weights)[0], image=image,
                              group=group, policy=policy))
    if not arrivals:
        raise InputError(f"--duration: no create arrives within {duration:g} s at --rate "
                         f"{rate:g} (the first one came at {now:.3f} s)", field="--duration")
    end = duration if duration is not None else arrivals[-1].time
    deletes = []
    for e in arrivals:
        gone = round(e.time + life(), 3)
        if gone <= end:
            deletes.append(Event(max(gone, e.time), DELETE, e.id))
    events = sorted(arrivals + deletes, key=lambda e: (e.time, e.kind == DELETE))
    return Trace(events, source=f"generated (seed {seed})")
