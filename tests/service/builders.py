"""Small builders for the service tests: compute nodes, and a stack reopened on the
same database as a restarted process opens it."""

from __future__ import annotations

from berth.config import SchedulerConfig
from berth.service.compute import ComputeNodeSpec
from berth.service.stack import Stack, open_stack

from .conftest import TEST_CONFIG


def node(host: str = "h1", **fields: object) -> ComputeNodeSpec:
    """A node of 8 vCPUs, 8 GiB and 100 GB unless told otherwise."""
    values: dict[str, object] = {"vcpus": 8, "memory_mb": 8192, "local_gb": 100, **fields}
    return ComputeNodeSpec(host=host, **values)  # type: ignore[arg-type]


def reopen(stack: Stack, config: SchedulerConfig = TEST_CONFIG) -> Stack:
    """A second stack on ``stack``'s database, as a restarted process opens it."""
    from berth.placement.db import create_db_engine

    url = stack.engine.url.render_as_string(hide_password=False)
    return open_stack(url, config, engine=create_db_engine(url))
