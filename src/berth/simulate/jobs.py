"""Replaying each configuration of a ``berth simulate`` run: one after the other in this
process, or side by side in worker processes.

Each configuration's replay stands alone: the cloud file registered in a scratch store
of its own (in its process's memory), a scheduler seeded with ``--seed``, the trace read
from its file. Nothing passes between two of them, so running them at once changes
nothing but the wall time: ``--jobs N`` (default: as many as the CPUs this process may
run on) replays up to N configurations at a time, each in a process of its own (started
afresh, ``spawn``: nothing of this process's state, its threads or open stores, is
inherited), and the results come back in the configurations' order, the same as
one after the other. With one configuration, one job or ``--url`` (a running Berth has
one configuration) the replay runs in this process.

A worker sends its progress (a message every 1/200 of its trace, at most four a
second), then its :class:`~berth.simulate.run.RunResult`, or the error that stopped it;
the first error stops the other workers and is reported as this process would have
reported it. Interrupting the command stops every worker.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from berth.errors import BerthError, InputError
from berth.simulate.run import Replay, RunResult
from berth.simulate.trace import AzureMachine, Trace, load_trace

#: Seconds between two progress messages of a worker (at most).
PROGRESS_EVERY = 0.25
#: Seconds the parent waits for a message before it looks at its workers again.
POLL = 0.2


@dataclass(frozen=True)
class ReplayOptions:
    """What every configuration's replay reads from the command line."""

    cloud: str | None
    trace: str
    url: str | None = None
    token: str = "admin"
    samples: int = 200
    limit: int | None = None
    seed: int = 0
    azure_machine: AzureMachine | None = None
    azure_machine_id: int | None = None

    @classmethod
    def from_args(cls, args: Any) -> ReplayOptions:
        return cls(args.cloud, args.trace, args.url, args.token, args.samples, args.limit,
                   args.seed, args.azure_machine, args.azure_machine_id)


@dataclass(frozen=True)
class Job:
    """One configuration to replay: its nova.conf files and its label."""

    files: tuple[str, ...]
    label: str


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def replay_configuration(options: ReplayOptions, job: Job, now: float, events: int, *,
                         trace: Trace | None = None,
                         on_trace: Callable[[Trace], None] | None = None,
                         on_event: Callable[[int], None] | None = None) -> RunResult:
    """Replay the trace under ``job``'s configuration. ``trace``, when given, is the one
    already read (the same file and options); ``on_trace`` is told the trace once read,
    before the replay starts; ``on_event`` the number of events replayed so far."""
    from berth.cli import _load_config

    config = _load_config(list(job.files))
    with _target(options, config, now, events) as (target, cloud):
        if trace is None:
            machine = options.azure_machine or (most_common_machine(cloud) if cloud else None)
            trace = load_trace(options.trace, machine=machine,
                               machine_id=options.azure_machine_id, limit=options.limit)
            if not trace.events:
                raise InputError(f"trace {options.trace}: no events", field="trace")
        if on_trace is not None:
            on_trace(trace)
        replay = Replay(target, trace, config=config, label=job.label,
                        samples=options.samples, on_event=on_event)
        result = replay.run()
    result.config_note = (f"the server at {options.url}" if options.url
                          else configuration_note(config, list(job.files)))
    return result


def replay_all(options: ReplayOptions, jobs: list[Job], now: float, events: int, *,
               workers: int, progress: bool | None) -> list[RunResult]:
    """Every configuration's result, in ``jobs``' order: in this process when
    ``workers`` is 1 or there is one job, else in up to ``workers`` processes at once.
    ``progress``: a progress bar per configuration on standard error (None: when it is
    a terminal)."""
    if workers <= 1 or len(jobs) <= 1:
        return _in_process(options, jobs, now, events, progress)
    return _in_workers(options, jobs, now, events, min(workers, len(jobs)), progress)


def _bar(label: str, total: int, position: int, progress: bool | None) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, desc=label, unit="ev", file=sys.stderr, position=position,
                disable=None if progress is None else not progress, mininterval=0.5)


def _in_process(options: ReplayOptions, jobs: list[Job], now: float, events: int,
                progress: bool | None) -> list[RunResult]:
    results: list[RunResult] = []
    trace: Trace | None = None  # read once, for the first configuration
    for job in jobs:
        shown = _Shown(job.label, progress)
        try:
            results.append(replay_configuration(options, job, now, events, trace=trace,
                                                on_trace=shown.start, on_event=shown.step))
        finally:
            shown.close()
        trace = shown.trace
    return results


class _Shown:
    """One configuration's progress bar in this process, made once its trace is read."""

    def __init__(self, label: str, progress: bool | None) -> None:
        self.label, self.progress = label, progress
        self.bar: Any = None
        self.trace: Trace | None = None

    def start(self, trace: Trace) -> None:
        self.trace = trace
        self.bar = _bar(self.label, len(trace.events), 0, self.progress)

    def step(self, _done: int) -> None:
        self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _in_workers(options: ReplayOptions, jobs: list[Job], now: float, events: int,
                workers: int, progress: bool | None) -> list[RunResult]:
    context = multiprocessing.get_context("spawn")
    messages: Any = context.Queue()
    level = logging.getLogger().getEffectiveLevel()
    bars = [_bar(job.label, events, i, progress) for i, job in enumerate(jobs)]
    results: dict[int, RunResult] = {}
    running: dict[int, Any] = {}
    waiting = list(range(len(jobs)))
    try:
        while waiting or running:
            while waiting and len(running) < workers:
                index = waiting.pop(0)
                process = context.Process(
                    target=_worker, name=f"berth-simulate-{jobs[index].label}", daemon=True,
                    args=(messages, index, options, jobs[index], now, events, level))
                _start_uninterruptible(process)
                running[index] = process
            with suppress(queue.Empty):
                _receive(messages.get(timeout=POLL), running, results, bars)
            # Every turn, not only when the queue is quiet: the other workers' progress
            # would otherwise keep a dead worker's slot taken until they end.
            _check_alive(messages, running, results, bars, jobs)
    finally:
        for process in running.values():
            process.terminate()
        for process in running.values():
            process.join()
        messages.close()
        for bar in bars:
            bar.close()
    return [results[i] for i in range(len(jobs))]


def _start_uninterruptible(process: Any) -> None:
    """Start ``process`` with interrupts ignored from its first instruction: a new
    interpreter keeps an ignored SIGINT ignored, where it would otherwise turn a Ctrl-C
    (sent to the whole process group) into a traceback while it imports. The parent
    stops its workers itself. (Ignored in this process only while the child is made.)"""
    if threading.current_thread() is not threading.main_thread():
        process.start()
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        process.start()
    finally:
        signal.signal(signal.SIGINT, previous)


def _receive(message: tuple[Any, ...], running: dict[int, Any], results: dict[int, RunResult],
             bars: list[Any]) -> None:
    """Act on one worker message (an error is raised here)."""
    kind, index, value = message
    bar = bars[index]
    if kind == "total":
        bar.total = value
        bar.refresh()
    elif kind == "progress":
        bar.update(value - bar.n)
    elif kind == "done":
        bar.update(bar.total - bar.n if bar.total else 0)
        bar.refresh()  # shown at 100% now, not when the last configuration ends
        results[index] = value
        running.pop(index).join()
    elif kind == "error":
        raise value
    elif kind == "crash":
        raise RuntimeError(value)


def _check_alive(messages: Any, running: dict[int, Any], results: dict[int, RunResult],
                 bars: list[Any], jobs: list[Job]) -> None:
    """Raise when a worker ended without a result (killed, out of memory): its last
    messages are read first, as it may have sent its result just before ending."""
    dead = [i for i, p in running.items() if p.exitcode is not None]
    if not dead:
        return
    while True:
        try:
            _receive(messages.get(timeout=POLL), running, results, bars)
        except queue.Empty:
            break
    for index in dead:
        if index in running and index not in results:
            code = running[index].exitcode
            raise BerthError(f"configuration {jobs[index].label}: its replay process ended "
                             f"without a result (exit code {code})")


def _worker(messages: Any, index: int, options: ReplayOptions, job: Job, now: float,
            events: int, level: int) -> None:
    """A worker process: replay ``job`` and send what happens (see the module's
    docstring). An interrupt is the parent's to handle: it stops the workers (SIGINT
    is ignored from the start, see :func:`_start_uninterruptible`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s")
    total = 0
    last = 0.0
    step = 1

    def on_trace(trace: Trace) -> None:
        nonlocal total, step
        total = len(trace.events)
        step = max(1, total // 200)
        messages.put(("total", index, total))

    def on_event(done: int) -> None:
        nonlocal last
        if done % step and done != total:
            return
        now_ = time.monotonic()
        if now_ - last >= PROGRESS_EVERY or done == total:
            last = now_
            messages.put(("progress", index, done))

    try:
        result = replay_configuration(options, job, now, events, on_trace=on_trace,
                                      on_event=on_event)
    except BerthError as exc:
        messages.put(("error", index, exc))
    except BaseException:  # noqa: BLE001 - a bug: the parent shows where it happened
        messages.put(("crash", index, f"configuration {job.label}: the replay process "
                                      f"failed:\n{traceback.format_exc()}"))
    else:
        messages.put(("done", index, result))
    messages.close()
    messages.join_thread()


def most_common_machine(cloud: Any) -> AzureMachine:
    """The size of the cloud's most common compute node."""
    from collections import Counter

    snap = cloud.snapshot
    sizes = Counter(zip(snap.num("vcpus_total").tolist(), snap.num("total_usable_ram_mb").tolist(),
                        snap.num("total_usable_disk_gb").tolist()))
    if not sizes:
        raise InputError("the cloud has no compute nodes to size an Azure trace on; give "
                         "--azure-machine", field="--azure-machine")
    (vcpus, ram, disk), _ = sizes.most_common(1)[0]
    return AzureMachine(int(vcpus), int(ram), int(disk))


def configuration_note(config: Any, files: list[str]) -> str:
    """What a configuration is, for the reports: its files and the options that matter."""
    fs = config.filter_scheduler
    return (f"{', '.join(files) or 'Nova defaults'} (ram_weight_multiplier="
            f"{fs.ram_weight_multiplier:g}, cpu_weight_multiplier={fs.cpu_weight_multiplier:g}, "
            f"disk_weight_multiplier={fs.disk_weight_multiplier:g}, "
            f"host_subset_size={fs.host_subset_size})")


@contextmanager
def _target(options: ReplayOptions, config: Any, now: float,
            events: int) -> Iterator[tuple[Any, Any]]:
    """The replay target for one configuration, ``(target, cloud or None)``: the cloud
    file in a scratch store (removed on exit), or the running Berth."""
    from berth.simulate.targets import LocalTarget, RemoteTarget

    if options.url:
        remote = RemoteTarget(options.url, token=options.token)
        try:
            yield remote, None
        finally:
            remote.close()
        return
    from berth.service.offline import offline_cloud

    assert options.cloud is not None
    with offline_cloud(options.cloud, config, now=now, events=events) as offline:
        local = LocalTarget(offline, seed=options.seed)
        try:
            yield local, offline.cloud
        finally:
            local.close()
