"""Host aggregates: a named set of service hosts carrying string metadata."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Aggregate:
    """A host aggregate (Nova's ``objects.Aggregate``).

    ``metadata`` maps str to str; ``hosts`` holds *service host* names (aggregates are
    keyed by host, not node). An aggregate with an ``availability_zone`` key defines an AZ.
    """

    id: int
    name: str
    uuid: str = ""
    hosts: tuple[str, ...] = ()
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def availability_zone(self) -> str | None:
        """The AZ this aggregate defines, if any."""
        return self.metadata.get("availability_zone")

    def __hash__(self) -> int:
        return hash(self.id)


def aggregate_names(aggregates: Iterable[Aggregate]) -> str:
    """The aggregates by name (else uuid, else id), sorted, for a filter's reason."""
    return ", ".join(sorted({a.name or a.uuid or str(a.id) for a in aggregates}))
