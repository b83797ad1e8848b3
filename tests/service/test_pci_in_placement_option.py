"""``[filter_scheduler] pci_in_placement = True``: taken by ``berth nova-scheduler``
(Nova's conductor makes the PCI request groups, Nova's computes report the devices), and
refused in one line by Berth's own services, which do neither."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from berth.cli import main
from berth.config import SchedulerConfig, check_own_services
from berth.errors import ConfigError
from berth.service.stack import open_stack

ROOT = Path(__file__).resolve().parents[2]
CLOUD = str(ROOT / "examples" / "cloud.yaml")
MESSAGE = "[filter_scheduler] pci_in_placement = True: only berth nova-scheduler takes it"


@pytest.fixture
def conf(tmp_path: Path) -> str:
    path = tmp_path / "nova.conf"
    path.write_text("[filter_scheduler]\npci_in_placement = True\n")
    return str(path)


def test_the_option_loads_and_only_berths_own_services_refuse_it(conf: str,
                                                                tmp_path: Path) -> None:
    config = SchedulerConfig.from_files([conf])
    assert config.filter_scheduler.pci_in_placement is True
    with pytest.raises(ConfigError) as info:
        check_own_services(config)
    assert str(info.value).startswith(MESSAGE)
    assert info.value.details["field"] == "[filter_scheduler] pci_in_placement"
    check_own_services(SchedulerConfig.default())  # False: nothing to refuse
    # The stack Berth's API, conductor and agents run on refuses it before touching the
    # database.
    db = tmp_path / "store.sqlite"
    with pytest.raises(ConfigError, match="only berth nova-scheduler takes it"):
        open_stack(f"sqlite:///{db}", config)
    assert not db.exists()


@pytest.mark.parametrize("argv", [
    ["schedule", CLOUD, "--flavor", "m1.small", "--now", "1800000000"],
    ["capacity", CLOUD, "--now", "1800000000"],
])
def test_the_offline_commands_refuse_it_in_one_line(
        conf: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*argv, "--config-file", conf]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {MESSAGE}") and err.count("\n") == 1


def test_a_scheduler_process_refuses_it_in_one_line(conf: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "berth.cli", "scheduler", "--config-file", conf,
         "--db", f"sqlite:///{tmp_path}/s.sqlite", "--transport-url", "memory://"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"berth scheduler: {MESSAGE}")
    assert not (tmp_path / "s.sqlite").exists()


def test_config_check_says_who_takes_it(conf: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "check", conf]) == 0
    out = capsys.readouterr().out
    assert ("warning: [filter_scheduler] pci_in_placement = True: berth nova-scheduler "
            "takes it") in out
