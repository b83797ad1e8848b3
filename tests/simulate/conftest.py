"""The replay tests' files: a small cloud, a trace of every kind of row, and a stacking
configuration (their texts are in ``test_simulate``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from simulate.test_simulate import CLOUD, STACK, TRACE


@pytest.fixture
def files(tmp_path: Path) -> tuple[str, str, str]:
    cloud, trace, stack = tmp_path / "cloud.yaml", tmp_path / "trace.csv", tmp_path / "stack.conf"
    cloud.write_text(CLOUD)
    trace.write_text(TRACE)
    stack.write_text(STACK)
    return str(cloud), str(trace), str(stack)
