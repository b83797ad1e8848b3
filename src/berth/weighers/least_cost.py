"""Legacy least-cost ranking (Nova before Grizzly, reference §12.10): the lowest total
cost wins.

``cost(host) = Σ weight_f × f(host, request)`` over ``[DEFAULT] least_cost_functions``,
with no normalization. Each function ``f`` is weighted by the DEFAULT option
``<short name>_weight``; only functions whose short name starts with ``compute_`` or
``noop`` are used (others are ignored with a warning, as Nova did). Built-ins:
``compute_fill_first_cost_fn`` (the host's free RAM; weight -1.0 by default, so the host
with the most free RAM costs least: spreading; a positive weight fills hosts first) and
``noop_cost_fn`` (1). Custom functions are named by dotted path and take
``(host_state, weighing_properties)`` (the RequestSpec) and return a number.

Select with ``[filter_scheduler] weighing_strategy = least_cost``, or, as seed 001's flag
file does, by naming ``least_cost_functions`` while leaving ``weighing_strategy`` unset
(a notice says so). The ranking reports ``weight = -cost`` so the pipeline's stable
"higher is better" sort picks the first host of minimum cost, and one explanation column
per function (raw and normalized = the function's value, multiplier = its weight,
contribution = its share of the cost). It is marked ``by_cost``: explanations show the
cost itself, with the seed's signs (lower is better), not the internal weight.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from berth.errors import ConfigError
from berth.weighers.handler import Ranking, WeigherColumn

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

LOG = logging.getLogger(__name__)

#: ``fn(host_state, weighing_properties) -> cost``.
CostFunction = Callable[["HostState", "RequestSpec"], float]

#: Module paths under which the built-in functions may be named.
BUILTIN_PREFIXES = ("nova.scheduler.least_cost.", "berth.weighers.least_cost.")

#: Short-name prefixes of the functions Nova's compute scheduler used.
USED_PREFIXES = ("compute_", "noop")


class SchedulerCostFunctionNotFound(ConfigError):
    """A ``least_cost_functions`` entry cannot be imported or is not callable."""

    code = "berth.config.cost_function_not_found"


class SchedulerWeightFlagNotFound(ConfigError):
    """A cost function has no ``<function name>_weight`` option set."""

    code = "berth.config.cost_weight_not_found"


def noop_cost_fn(host_state: HostState, weighing_properties: RequestSpec) -> float:
    """Every host costs 1."""
    return 1


def compute_fill_first_cost_fn(host_state: HostState, weighing_properties: RequestSpec) -> float:
    """The host's free RAM: with a negative weight more free RAM costs less (spreading)."""
    return host_state.free_ram_mb


BUILTIN_COST_FUNCTIONS: dict[str, CostFunction] = {
    "noop_cost_fn": noop_cost_fn,
    "compute_fill_first_cost_fn": compute_fill_first_cost_fn,
}

#: Column versions of the built-ins (one array operation instead of a call per host).
_BULK: dict[Any, Callable[[Hosts], np.ndarray]] = {
    noop_cost_fn: lambda hosts: np.ones(len(hosts)),
    compute_fill_first_cost_fn: lambda hosts: hosts.col("free_ram_mb"),
}


@dataclass(frozen=True)
class WeightedCostFunction:
    """One configured cost function with its weight."""

    name: str
    path: str
    weight: float
    fn: CostFunction


def resolve_cost_function(path: str) -> CostFunction:
    """The function a ``least_cost_functions`` entry names (built-in or dotted path)."""
    short = path.rsplit(".", 1)[-1]
    if "." not in path or path.startswith(BUILTIN_PREFIXES):
        fn = BUILTIN_COST_FUNCTIONS.get(short)
        if fn is None:
            raise SchedulerCostFunctionNotFound(
                f"[DEFAULT] least_cost_functions: no built-in cost function {short!r} "
                f"(built-ins: {', '.join(sorted(BUILTIN_COST_FUNCTIONS))})",
                function=path,
            )
        return fn
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SchedulerCostFunctionNotFound(
            f"[DEFAULT] least_cost_functions: cannot import module {module_name!r} "
            f"for {path!r}: {exc}",
            function=path,
        ) from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise SchedulerCostFunctionNotFound(
            f"[DEFAULT] least_cost_functions: {path!r} is not a function of module "
            f"{module_name!r}",
            function=path,
        )
    return fn  # type: ignore[no-any-return]


class LeastCostRanker:
    """Ranks hosts by ascending total cost (first minimum first); see the module docstring."""

    def __init__(self, functions: Sequence[WeightedCostFunction]) -> None:
        self.functions = list(functions)

    @classmethod
    def from_config(cls, config: SchedulerConfig) -> LeastCostRanker:
        """Load ``[DEFAULT] least_cost_functions`` and their weights (fails at start-up)."""
        default = config.group("DEFAULT")
        functions: list[WeightedCostFunction] = []
        for path in default.least_cost_functions or ():
            path = path.strip()
            short = path.rsplit(".", 1)[-1]
            if not short.startswith(USED_PREFIXES):
                LOG.warning(
                    "[DEFAULT] least_cost_functions: ignoring %s (only functions named "
                    "compute_* or noop* are used)", path,
                )
                continue
            fn = resolve_cost_function(path)
            flag = f"{short}_weight"
            weight = default.get(flag)
            if weight is None:
                raise SchedulerWeightFlagNotFound(
                    f"[DEFAULT] {flag} is not set: the least-cost function {path} needs a "
                    "weight (a number; negative prefers hosts where the function is large)",
                    option=flag,
                )
            functions.append(WeightedCostFunction(short, path, float(weight), fn))
        return cls(functions)

    def values(self, entry: WeightedCostFunction, hosts: Hosts, spec: RequestSpec) -> np.ndarray:
        """One function's value on every host (a column for the built-ins)."""
        bulk = _BULK.get(entry.fn)
        if bulk is not None:
            return np.asarray(bulk(hosts), dtype=float)
        out = np.empty(len(hosts))
        for pos, host_state in enumerate(hosts.states()):
            value = entry.fn(host_state, spec)
            try:
                out[pos] = float(value)
            except (TypeError, ValueError):
                raise ConfigError(
                    f"least-cost function {entry.path} returned {value!r} for host "
                    f"{host_state.host}/{host_state.nodename}; it must return a number",
                    function=entry.path,
                ) from None
        return out

    def cost(self, host_state: HostState, spec: RequestSpec) -> float:
        """One host's total cost, function by function (the per-host path)."""
        total = 0.0
        for entry in self.functions:
            total += entry.weight * float(entry.fn(host_state, spec))
        return total

    def rank(self, hosts: Hosts, spec: RequestSpec) -> Ranking:
        """Weights are minus the costs; the order is ascending cost, ties in input order."""
        costs = np.zeros(len(hosts))
        columns: list[WeigherColumn] = []
        for entry in self.functions:
            values = self.values(entry, hosts, spec)
            costs = costs + entry.weight * values
            columns.append(
                WeigherColumn(entry.name, values, values, np.full(len(hosts), entry.weight))
            )
        # The order is implied: a stable descending sort of -cost is the ascending cost
        # order with ties in input order, so the pipeline may take only the head it needs.
        return Ranking(-costs, None, columns, by_cost=True)
