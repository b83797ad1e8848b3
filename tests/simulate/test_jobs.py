"""``berth simulate`` with several configurations: replayed side by side, one process
each, with the results, errors and interrupts of a replay one after the other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth.cli import main
from berth.errors import BerthError
from berth.simulate import jobs
from simulate.test_simulate import TRACE

#: What differs between two replays of the same configuration: the times.
TIMES = ("wall_seconds", "events_per_second", "request_ms")


def _without_times(path: Path) -> list[dict[str, object]]:
    configurations = json.loads(path.read_text())["configurations"]
    return [{k: v for k, v in c.items() if k not in TIMES} for c in configurations]


def test_configurations_side_by_side_give_what_one_after_the_other_gives(
        files: tuple[str, str, str], tmp_path: Path) -> None:
    cloud, trace, stack = files
    spread = tmp_path / "spread.conf"
    spread.write_text("[filter_scheduler]\nram_weight_multiplier = 2.0\n")
    common = ["simulate", cloud, trace, "--config-file", str(spread), "--compare", stack,
              "--compare", str(spread), "--no-progress", "--samples", "25", "--now", "1.7e9"]
    assert main([*common, "--jobs", "2", "--json", str(tmp_path / "side.json")]) == 0
    assert main([*common, "--jobs", "1", "--json", str(tmp_path / "alone.json")]) == 0
    side = _without_times(tmp_path / "side.json")
    assert side == _without_times(tmp_path / "alone.json")
    # In the configurations' order, with their own labels; the third one ran once a
    # worker was free, and stacking and spreading did differ.
    assert [c["label"] for c in side] == ["spread", "stack", "spread-2"]
    assert side[0]["samples"] == side[2]["samples"] != side[1]["samples"]


def test_an_error_in_one_configuration_is_one_line(
        files: tuple[str, str, str], capsys: pytest.CaptureFixture[str]) -> None:
    cloud, trace, stack = files
    Path(trace).write_text(TRACE.replace("small,cirros", "small,fedora"))
    assert main(["simulate", cloud, trace, "--compare", stack, "--jobs", "2",
                 "--no-progress"]) == 3
    err = capsys.readouterr().err
    assert err.startswith("error: trace ") and "image 'fedora' is not the cloud's" in err
    assert len(err.strip().splitlines()) == 1


class _Ended:
    """A worker process that has ended with ``exitcode``."""

    def __init__(self, exitcode: int) -> None:
        self.exitcode = exitcode


class _NoMessages:
    def get(self, timeout: float) -> object:
        import queue

        raise queue.Empty


def test_a_worker_that_ends_without_a_result_is_reported() -> None:
    """Killed (out of memory, say): the configuration and the exit code, not a hang."""
    job = jobs.Job(("stack.conf",), "stack")
    with pytest.raises(BerthError, match="configuration stack: its replay process ended "
                                         r"without a result \(exit code -9\)"):
        jobs._check_alive(_NoMessages(), {0: _Ended(-9)}, {}, [None], [job])


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _spawned(pid: int) -> list[int]:
    found = []
    for child in _children(pid):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(child)
    return found


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs /proc to find the workers")
def test_an_interrupt_stops_every_worker(files: tuple[str, str, str], tmp_path: Path) -> None:
    """Ctrl-C on the command (its whole process group, as a terminal sends it): exit
    130, no traceback, and the workers gone with it."""
    cloud, _, stack = files
    long = tmp_path / "long.csv"
    long.write_text("time,event,id,flavor\n" + "".join(
        f"{2 * i},create,v{i},small\n{2 * i + 1},delete,v{i},\n" for i in range(20_000)))
    berth = Path(sys.executable).with_name("berth")
    proc = subprocess.Popen([str(berth), "simulate", cloud, str(long), "--compare", stack,
                             "--jobs", "2", "--no-progress"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        workers: list[int] = []
        while time.monotonic() < deadline and proc.poll() is None:
            workers = _spawned(proc.pid)
            if len(workers) == 2:
                break
            time.sleep(0.1)
        assert len(workers) == 2, "the two workers never started"
        time.sleep(1.0)  # replaying by now
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130 and err == "" and out == ""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
        time.sleep(0.1)
    assert not any(Path(f"/proc/{w}").exists() for w in workers)
