"""The scheduler's answer for one instance: a host (the first) or an alternate."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Selection:
    """Nova's ``Selection`` (version 1.1), built from a host state by the pipeline.

    ``allocation_request`` is the JSON text of the placement allocation request (the
    string ``"null"`` when there is none), exactly as Nova serializes it.
    """

    compute_node_uuid: str | None
    service_host: str
    nodename: str
    cell_uuid: str | None
    limits: dict[str, Any] = field(default_factory=dict)
    allocation_request: str = "null"
    allocation_request_version: str | None = None
    availability_zone: str | None = None

    @property
    def allocation_request_dict(self) -> dict[str, Any] | None:
        """The decoded allocation request, or None."""
        value = json.loads(self.allocation_request)
        return value if isinstance(value, dict) else None

    def to_dict(self) -> dict[str, Any]:
        """Nova's legacy form: host, nodename and the non-None limits."""
        limits = {k: v for k, v in self.limits.items() if v is not None}
        return {"host": self.service_host, "nodename": self.nodename, "limits": limits}
