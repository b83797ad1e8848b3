"""Host reports through the bus: the agents' side and the schedulers' side.

A compute agent's report (the :class:`~berth.snapshot.HostRecord` as JSON, see
:func:`~berth.service.records.record_to_report`) goes two ways:

* to every scheduler, as the ``update_host_states`` fanout cast on topic ``scheduler``
  (the reports as one JSON string, :func:`received_reports`)
  (seed 003: "every compute node periodically publishes its status, available
  resources and capabilities to the scheduler through the queue"). Reports are
  coalesced: an agent process sends what changed every ``flush_interval`` (50 ms) in
  one message per chunk of :data:`CHUNK` reports. A report whose content is the one
  last sent for its host goes as its heartbeat alone (the ``host_heartbeats`` cast,
  every such host of the process in one message), so a fleet's periodic reports cost a
  scheduler a number per host, not a report to parse; every host's report goes whole
  again now and then (:meth:`BusRecordStore.resend`);
* to the shared database (:class:`~berth.service.records.ComputeRecordStore`), only when
  something besides the heartbeat changed: it is what a scheduler warms its snapshot
  from before it serves, and what an agent restarted on the same database takes its
  instances back from.

:class:`BusRecordStore` is the agents' side (a record store whose ``publish`` does
both); :class:`BusFeed` is a scheduler's snapshot fed from the fanout.

Liveness: the scheduler judges a host up from the heartbeat its last report carried
(``service_down_time``, as always). Stored heartbeats say nothing about liveness, since
the database is not written for a heartbeat alone (and a fleet's registration may take
longer than ``service_down_time``); so a scheduler that starts counts every stored
host's heartbeat from its own start (a grace period): the host is down only if no report
of it arrives within ``service_down_time`` of that. A host forced down stays down
(ComputeFilter reads ``forced_down`` whatever the heartbeat).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import orjson
from sqlalchemy.engine import Engine

from berth.service.bus import Bus, BusError
from berth.service.records import (
    ComputeRecordStore,
    SnapshotFeed,
    encode_reports,
    report_beat,
    report_to_record,
    report_with_beat,
)
from berth.snapshot import HostSnapshot

LOG = logging.getLogger(__name__)

#: Reports per fanout message.
CHUNK = 500

#: Report fields that change with every heartbeat; a report differing from the stored
#: one only in these is not written to the database.
_VOLATILE_SERVICE = ("last_seen_up", "updated_at")


def received_reports(reports: Any = None, reports_json: Any = None) -> list[dict[str, Any]]:
    """The reports of an ``update_host_states`` cast: sent as one JSON string
    (``reports_json``, RPC 1.1), or as a list (``reports``: 1.0, an agent of an earlier
    version). ValueError when the cast is not a list of reports; an entry that is not a
    report (an object naming its ``host`` and, if any, its ``uuid`` as strings) is
    logged and dropped, the others kept."""
    if reports_json is not None:
        if not isinstance(reports_json, (str, bytes)):
            raise ValueError("update_host_states: reports_json is not a string")
        decoded = orjson.loads(reports_json)
        if not isinstance(decoded, list):
            raise ValueError("update_host_states: reports_json is not a JSON list")
    elif reports is None:
        return []
    elif isinstance(reports, list):
        decoded = reports
    else:
        raise ValueError("update_host_states: reports is not a list")
    kept = [r for r in decoded if isinstance(r, dict) and isinstance(r.get("host"), str)
            and isinstance(r.get("uuid", ""), str)]
    if len(kept) != len(decoded):
        LOG.error("update_host_states: %d of %d entries are not host reports; dropped",
                  len(decoded) - len(kept), len(decoded))
    return kept


def _content_key(report: Mapping[str, Any]) -> bytes:
    """The report without its heartbeat, as canonical JSON (orjson: a fifth of the
    standard library's time, paid for every report an agent sends)."""
    data = dict(report)
    data.pop("updated", None)
    service = data.get("service")
    if isinstance(service, Mapping):
        data["service"] = {k: v for k, v in service.items() if k not in _VOLATILE_SERVICE}
    return orjson.dumps(data, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS,
                        default=str)


class BusRecordStore(ComputeRecordStore):
    """An agent process's record store: every report goes to the schedulers over the
    bus, and to the database when it changed beyond its heartbeat.

    ``preload()`` reads every stored report once (a fleet's start-up), so the agents'
    :meth:`report_of` does not read them one by one. ``deferred()`` collects the
    database writes of a registration wave and writes them in one batch at its end.
    """

    def __init__(self, engine: Engine, bus: Bus, *, flush_interval: float = 0.05) -> None:
        super().__init__(engine)
        self.bus = bus
        self._fanout = bus.client("scheduler", fanout=True)
        self._stored: dict[str, bytes] = {}
        self._outbox: dict[str, dict[str, Any]] = {}
        #: Heartbeats of hosts whose last report sent is still their state.
        self._beats_out: dict[str, float] = {}
        #: The content of the last report sent on the bus, per host.
        self._sent: dict[str, bytes] = {}
        self._out_lock = threading.Lock()
        self._batch_lock = threading.Lock()
        self._commit_lock = threading.Lock()
        self._open_batch: _Batch | None = None
        self._stop = threading.Event()
        self.flush_interval = flush_interval
        #: Reports sent, messages sent, and sends that failed (retried next flush).
        self.sent_reports = 0
        self.sent_messages = 0
        self.failed_sends = 0
        self._thread = threading.Thread(target=self._flush_loop, name="report-flush",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ database side
    def preload(self, uuids: Iterable[str] | None = None) -> None:
        """Read the stored reports at once (see the base class); what is stored is not
        written again unchanged."""
        super().preload(uuids)
        assert self._preloaded is not None
        self._stored.update({u: _content_key(r) for u, r in self._preloaded.items()})

    def publish(self, uuid: str, report: Mapping[str, Any], heartbeat: float | None) -> int:
        """Queue the report for the schedulers; write it to the database first when it
        changed beyond its heartbeat (so a build's instance is stored, for a restarted
        agent, by the time the build returns). Returns 0: the change number is the
        batch's."""
        key = _content_key(report)
        seq = 0
        if self._stored.get(uuid) != key:
            if not self._defer(uuid, report, heartbeat):
                self._write_through(uuid, report, heartbeat)
            self._stored[uuid] = key
        with self._out_lock:
            if self._sent.get(uuid) == key and uuid not in self._outbox and heartbeat is not None:
                self._beats_out[uuid] = float(heartbeat)
            else:
                self._outbox[uuid] = dict(report)
                self._beats_out.pop(uuid, None)
                self._sent[uuid] = key
        return seq

    def heartbeats(self, beats: Mapping[str, float]) -> int:
        """Queue heartbeats alone for the schedulers (see :meth:`heartbeat`); the
        database is not written for them. Returns 0 (no change number)."""
        for uuid, beat in beats.items():
            self.heartbeat(uuid, beat)
        return 0

    def heartbeat(self, uuid: str, beat: float) -> None:
        """Queue a heartbeat alone for a host whose state its last report carries (a
        report still queued for it takes the newer beat instead)."""
        with self._out_lock:
            queued = self._outbox.get(uuid)
            if queued is not None:
                self._outbox[uuid] = report_with_beat(queued, beat)
            else:
                self._beats_out[uuid] = float(beat)

    def resend(self, uuids: Iterable[str]) -> None:
        """Send the next report of these hosts whole, not as a heartbeat (a periodic
        full refresh, so a scheduler that missed a report catches up)."""
        with self._out_lock:
            for uuid in uuids:
                self._sent.pop(uuid, None)

    def _write_through(self, uuid: str, report: Mapping[str, Any], beat: float | None) -> None:
        """Write one report and return once it is committed, sharing the transaction
        with the reports other threads write meanwhile (a group commit: one change
        counter update and one commit for all of them, where one each would serialize
        every build of the process on the counter's row)."""
        batch = self._join_batch((uuid, report, beat))
        batch.done.wait()
        if batch.error is not None:
            raise batch.error

    def _join_batch(self, item: tuple[str, Mapping[str, Any], float | None]) -> _Batch:
        with self._batch_lock:
            batch = self._open_batch
            if batch is None:
                batch = self._open_batch = _Batch()
                leader = True
            else:
                leader = False
            batch.items.append(item)
        if leader:
            # The first writer commits for everyone who joined while the previous
            # batch was being written.
            with self._commit_lock:
                with self._batch_lock:
                    self._open_batch = None
                try:
                    self.publish_many(batch.items)
                except Exception as exc:  # every writer of the batch sees the failure
                    batch.error = exc
                finally:
                    batch.done.set()
        return batch

    # ------------------------------------------------------------ bus side
    def announce_aggregates(self) -> None:
        """Tell every scheduler the aggregates changed (Nova's ``update_aggregates``
        fanout; Berth's schedulers re-read them from the database)."""
        try:
            self._fanout.cast("update_aggregates")
        except BusError as exc:
            LOG.warning("could not announce the aggregates' change: %s", exc)

    def flush(self) -> int:
        """Send the queued reports now; returns how many were sent. A send that fails
        (broker gone) puts them back, unless newer ones for the same hosts came
        meanwhile, and is retried on the next flush."""
        with self._out_lock:
            out, self._outbox = self._outbox, {}
            beats, self._beats_out = self._beats_out, {}
        if beats:
            try:
                self._fanout.cast("host_heartbeats", beats=beats)
                self.sent_messages += 1
            except BusError as exc:
                self.failed_sends += 1
                LOG.warning("heartbeats not sent (%s); retrying", exc)
                with self._out_lock:
                    for uuid, beat in beats.items():
                        self._beats_out.setdefault(uuid, beat)
        if not out:
            return 0
        reports = list(out.values())
        sent = 0
        for start in range(0, len(reports), CHUNK):
            chunk = reports[start:start + CHUNK]
            try:
                # As one JSON string: the transport's JSON then copies a string instead
                # of walking 500 reports' dicts with the standard library's encoder.
                self._fanout.cast("update_host_states", version="1.1",
                                  reports_json=encode_reports(chunk))
            except BusError as exc:
                self.failed_sends += 1
                LOG.warning("host reports not sent (%s); retrying", exc)
                with self._out_lock:
                    for report in reports[start:]:
                        uuid = str(report.get("uuid"))
                        if uuid not in self._outbox:
                            self._outbox[uuid] = report
                            self._beats_out.pop(uuid, None)
                break
            sent += len(chunk)
            self.sent_messages += 1
        self.sent_reports += sent
        return sent

    def _flush_loop(self) -> None:
        while not self._stop.wait(self.flush_interval):
            try:
                self.flush()
            except Exception:  # the loop must survive anything a send throws
                LOG.exception("sending host reports failed")

    def close(self) -> None:
        """Send what is queued, stop the sender, close the kept connection."""
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.flush()
        except Exception:
            LOG.exception("sending the last host reports failed")
        super().close()


class _Batch:
    """Reports written in one transaction, and the writers waiting for it."""

    def __init__(self) -> None:
        self.items: list[tuple[str, Mapping[str, Any], float | None]] = []
        self.done = threading.Event()
        self.error: Exception | None = None


class BusFeed(SnapshotFeed):
    """A scheduler's snapshot: warmed from the stored reports, then fed by the fanout.

    :meth:`receive` (the RPC server's threads) queues reports; :meth:`refresh` (the
    scheduler, before each request) applies what is queued, keeping for each node only
    reports newer than the one applied (by the heartbeat they carry). Aggregates are
    re-read from the database when an ``update_aggregates`` cast says they changed.
    """

    def __init__(self, store: ComputeRecordStore, *, service_down_time: float,
                 clock: Any = time.time) -> None:
        super().__init__(store)
        self.service_down_time = service_down_time
        self.clock = clock
        self.started_at = clock()
        self._pending: collections.deque[Mapping[str, Any]] = collections.deque()
        self._pending_beats: collections.deque[Mapping[str, float]] = collections.deque()
        self._aggregates_stale = True
        self._beats: dict[str, float] = {}
        self._pending_deleted: collections.deque[tuple[list[str], float]] = collections.deque()
        #: Nodes deleted (uuid -> when): a report or heartbeat sent before that, still
        #: on its way, does not bring the row back; a later one (the node registered
        #: again) does.
        self._deleted: dict[str, float] = {}
        self.applied = 0
        self.stale_dropped = 0
        #: Reports and heartbeats dropped because they could not be applied.
        self.malformed = 0

    def warm(self) -> HostSnapshot:
        """Load every stored report, each host's heartbeat counted from this
        scheduler's start when it is older (the start-up grace, see the module doc)."""
        with self._lock:
            changes = self.store.changes(0)
            for report in changes.reports:
                alone = changes.beats.get(str(report.get("uuid")))
                beat = report_beat(report)
                if alone is not None and (beat is None or alone > beat):
                    beat = alone  # a heartbeat stored alone after the report
                if beat is not None:
                    report = report_with_beat(report, max(beat, self.started_at))
                self._apply(report, force=True)
                if beat is not None:  # order later reports by the beat the host sent
                    self._beats[str(report.get("uuid") or report["host"])] = beat
            self.seq = changes.top
            self.snapshot.set_aggregates(self.store.aggregates())
            self.snapshot.disabled_cells = self.store.disabled_cells()
            self._aggregates_stale = False
        return self.snapshot

    def receive(self, reports: Iterable[Mapping[str, Any]]) -> None:
        """Queue reports from the bus."""
        self._pending.extend(reports)

    def receive_beats(self, beats: Mapping[str, float]) -> None:
        """Queue heartbeats (node uuid -> beat) from the bus."""
        self._pending_beats.append(beats)

    def aggregates_changed(self) -> None:
        """The aggregates are to be re-read before the next request."""
        self._aggregates_stale = True

    def receive_deleted(self, uuids: Iterable[str], deleted_at: float) -> None:
        """Queue the deletion of compute nodes (their service was deleted at
        ``deleted_at``)."""
        self._pending_deleted.append((list(uuids), deleted_at))

    def refresh(self) -> HostSnapshot:
        """Apply the queued reports (and changed aggregates); returns the snapshot."""
        with self._lock:
            if self._aggregates_stale:
                self._aggregates_stale = False
                self.snapshot.set_aggregates(self.store.aggregates())
                self.snapshot.disabled_cells = self.store.disabled_cells()
            deleted = self._pending_deleted
            while deleted:
                uuids, at = deleted.popleft()
                for uuid in uuids:
                    self._deleted[uuid] = at
                    self._beats.pop(uuid, None)
                self.uuid_rows.drop(self.snapshot, uuids)
            pending = self._pending
            while pending:
                report = pending.popleft()
                try:
                    self._apply(report)
                except Exception:  # one bad report must not fail the request
                    self.malformed += 1
                    LOG.exception("host report of %r dropped: it cannot be applied",
                                  report.get("host"))
            beats = self._pending_beats
            while beats:
                for uuid, beat in beats.popleft().items():
                    try:
                        when = float(beat)
                    except (TypeError, ValueError):
                        self.malformed += 1
                        LOG.error("heartbeat %r of %r dropped: not a time", beat, uuid)
                        continue
                    self._apply_beat(str(uuid), when)
        return self.snapshot

    def _apply_beat(self, uuid: str, beat: float) -> None:
        """A host's new heartbeat: the service record and its column (both paths of
        ComputeFilter read the same). A host this snapshot does not know yet (its
        report went by before this scheduler listened) is read from the database."""
        last = self._beats.get(uuid)
        if (last is not None and beat < last) or self._was_deleted(uuid, beat):
            self.stale_dropped += 1
            return
        row = self.uuid_rows.get(uuid)
        if row is None:
            stored = self.store.report_of(uuid)
            if stored is not None:
                self._apply(report_with_beat(stored, beat), force=True)
                self._beats[uuid] = beat
            return
        self._beats[uuid] = beat
        self._set_beat(row, beat)
        self.applied += 1

    def _apply(self, report: Mapping[str, Any], force: bool = False) -> None:
        uuid = str(report.get("uuid") or report["host"])
        beat = report_beat(report)
        if not force and self._was_deleted(uuid, beat):
            self.stale_dropped += 1
            return
        if not force and beat is not None:
            last = self._beats.get(uuid)
            if last is not None and beat < last:
                self.stale_dropped += 1
                return
        record = report_to_record(report)  # first: a report that fails leaves no trace
        if beat is not None:
            self._beats[uuid] = beat
        row = self.snapshot.upsert(record)
        if record.uuid:
            self.uuid_rows[record.uuid] = row
        self.applied += 1

    def _was_deleted(self, uuid: str, beat: float | None) -> bool:
        """Whether a report or heartbeat of ``uuid`` predates the node's deletion (one
        sent after it, by a node registered again, ends the deletion)."""
        at = self._deleted.get(uuid)
        if at is None:
            return False
        if beat is not None and beat > at:
            del self._deleted[uuid]
            return False
        return True
