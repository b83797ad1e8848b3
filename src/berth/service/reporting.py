"""The periodic reports of a process's compute agents, from one thread.

Nova's compute service sends its heartbeat every ``report_interval`` and its resource
tracker publishes the node's state when it changes (and in its periodic task). A process
running many agents — ``berth compute --fleet``, the all-in-one ``berth serve --cloud``
— does that for all of them from one :class:`Reporter` thread rather than one thread
per host (10,000 threads, each reading its provider back from Placement every round,
kept both CPUs of a 2-core machine busy at idle). Each round:

* an agent whose Placement publication failed part-way (``placement_pending``) tries
  again; the others make no call (their provider holds what they published);
* once every ``whole_every`` rounds, each agent publishes its whole state if it
  changed since its last report (a failed build's counter, say, which no report
  carried yet), or else its heartbeat — on the bus, its whole state in any case, so a
  scheduler that missed a report catches up; in the other rounds, its heartbeat. The
  whole reports are spread: each round takes every ``whole_every``-th agent in turn.
  (Sent all in one round, 10,000 whole reports held each scheduler's next request
  while it applied them: 0.14-0.31 s on an idle machine, a sixth of that now.)
* the heartbeats of the round go to the record store in one call
  (:meth:`~berth.service.records.ComputeRecordStore.heartbeats`: one transaction on
  the database, one message on the bus).

A silent agent (a host that is down) sends nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from berth.service.compute import ComputeAgent
from berth.service.records import ComputeRecordStore

LOG = logging.getLogger(__name__)

#: Once in this many rounds, each agent's whole state goes out (when it changed).
WHOLE_EVERY = 6


class Reporter:
    """Periodic reports of ``agents()`` (see the module doc)."""

    def __init__(self, agents: Callable[[], Iterable[ComputeAgent]],
                 records: ComputeRecordStore, *, whole_every: int = WHOLE_EVERY,
                 resend: Callable[[Iterable[str]], None] | None = None) -> None:
        """``resend`` is given the agents (node uuids) whose whole state is due, and
        those then publish it whether it changed or not (the bus's store forgets what
        it sent them, so their reports go out whole)."""
        self.agents = agents
        self.records = records
        self.whole_every = max(1, whole_every)
        self.resend = resend
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def report_round(self, whole: bool = False, *, part: int | None = None) -> int:
        """One round now; returns how many agents reported (state or heartbeat). The
        whole state is due for every agent with ``whole``, for every
        ``whole_every``-th agent from the ``part``-th with ``part``, else for none."""
        agents = [a for a in self.agents() if not a.silent]
        if whole:
            due = {a.uuid for a in agents}
        elif part is not None:
            due = {a.uuid for a in agents[part % self.whole_every::self.whole_every]}
        else:
            due = set()
        if due and self.resend is not None:
            self.resend(due)
        beats: dict[str, float] = {}
        count = 0
        for agent in agents:
            try:
                if agent.placement_pending:
                    agent.sync_placement()
                if agent.uuid not in due:
                    beats[agent.uuid] = agent.beat()
                elif self.resend is not None:
                    agent.report()
                elif agent.report(if_changed=True) is None:
                    beats[agent.uuid] = agent.beat()
                count += 1
            except Exception:  # one host's failure must not silence the others
                LOG.exception("compute %s: report failed", agent.node.host)
        if beats:
            try:
                self.records.heartbeats(beats)
            except Exception:  # the next round sends newer ones
                LOG.exception("%d heartbeats not stored", len(beats))
        return count

    def start(self, interval: float) -> None:
        """A round every ``interval`` seconds (``[DEFAULT] report_interval``) from now
        on; agents added meanwhile join the next round."""

        def loop() -> None:
            while not self._stop.wait(interval):
                self.report_round(part=self.rounds)
                self.rounds += 1

        self._thread = threading.Thread(target=loop, name="compute-reports", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the rounds (the one running finishes)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
