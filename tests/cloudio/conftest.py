"""Fixtures for the import/export tests: a cloud file registered into a Berth store by
``berth serve``'s own seeding, served as a whole OpenStack by :mod:`.fake_openstack`."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from berth.cloudfile import Cloud, load_cloud
from berth.config import SchedulerConfig
from berth.service.seeding import seed_from_cloud
from berth.service.stack import Stack, open_stack

from .fake_openstack import FakeOpenStack, clouds_yaml, serving


@dataclass
class LocalCloud:
    """A running fake OpenStack: its URL, the app (to add bad data), the Berth stack
    behind its Placement API, the cloud file it renders and its ``clouds.yaml``."""

    url: str
    app: FakeOpenStack
    stack: Stack
    path: Path
    cloud: Cloud
    clouds_yaml: Path
    now: float


@pytest.fixture
def local_cloud_factory(tmp_path: Path) -> Iterator[Any]:
    """``start(doc, max_version=...)`` -> a :class:`LocalCloud` serving ``doc``."""
    started: list[Any] = []

    def start(doc: dict[str, Any], max_version: str = "2.100") -> LocalCloud:
        path = tmp_path / f"source-{len(started)}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        config = SchedulerConfig.default()
        now = time.time()
        cloud = load_cloud(str(path), config, now=now)
        stack = open_stack(f"sqlite:///{tmp_path}/placement-{len(started)}.sqlite", config)
        seed_from_cloud(stack, str(path))
        app = FakeOpenStack(doc, cloud, stack.placement_app, max_version=max_version)
        app.now = now
        server = serving(app)
        url = server.__enter__()
        started.append((server, stack))
        config_file = tmp_path / f"clouds-{len(started)}.yaml"
        config_file.write_text(clouds_yaml(url))
        return LocalCloud(url, app, stack, path, cloud, config_file, now)

    yield start
    for server, stack in started:
        server.__exit__(None, None, None)
        stack.close()
