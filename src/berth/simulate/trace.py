"""Workload traces: create and delete events in time order.

Two formats are read, and one is written:

* **CSV** (``.csv``, documented in ``docs/simulate.md``): a header row, then one event
  per row::

      time,event,id,flavor,image,num,group,policy,hints,project,availability_zone
      0.0,create,web-1,m1.small,ubuntu,1,web,anti-affinity,,demo,
      12.5,create,db-1,m1.large,,2,,,"{""different_host"": [""web-1""]}",,az1
      600,delete,web-1,,,,,,,,

  ``time`` is seconds from the trace's start (a number >= 0), ``event`` is ``create``
  or ``delete``, ``id`` names the workload item (a create's instances are deleted
  together by a later ``delete`` with the same id). A create needs ``flavor``; the
  other columns are optional: ``image`` (a name the cloud knows), ``num`` (instances
  in one request, 1 to 1000, default 1), ``group`` (a server group name of at most 255
  characters: the cloud's, or created on first use with ``policy``), ``hints`` (a JSON
  object of scheduler hints; values of ``same_host`` / ``different_host`` may name
  earlier ids of the trace; an availability zone is not a hint), ``project``,
  ``availability_zone`` (the zone the boot asks for, as a server create's
  ``availability_zone``). Only ``time``, ``event`` and ``id`` must be in the header,
  each column at most once. The file is UTF-8 (a byte order mark is allowed).

* **The Azure packing trace 2020** (``.sqlite`` / ``.db``): tables ``vm`` (``vmId``,
  ``tenantId``, ``vmTypeId``, ``priority``, ``starttime``, ``endtime``) and ``vmType``
  (``id``, ``vmTypeId``, ``machineId``, ``core``, ``memory``, ``hdd``, ``ssd``,
  ``nic``); times in fractional days (``endtime`` NULL: still running at the end),
  sizes as fractions of one machine of type ``machineId``. Each VM type becomes a
  flavor ``azure-<vmTypeId>`` sized on a reference machine (:class:`AzureMachine`, by
  default the cloud's most common host), using the rows of one machine type.

Every malformed row is a :class:`~berth.errors.InputError` naming the line and the
column.
"""

from __future__ import annotations

import csv
import json
import math
import sqlite3
import uuid as uuidlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from berth.errors import InputError
from berth.model.request import MAX_INSTANCES_PER_REQUEST, InstanceGroup

CREATE = "create"
DELETE = "delete"
COLUMNS = ("time", "event", "id", "flavor", "image", "num", "group", "policy", "hints",
           "project", "availability_zone")
REQUIRED = ("time", "event", "id")
#: Hints whose values are instance uuids: a trace may name its own ids there instead.
INSTANCE_HINTS = ("same_host", "different_host")
#: Seconds in the Azure trace's time unit (fractional days).
DAY = 86_400.0
#: The longest server group name (Nova's, and ``POST /server-groups``').
MAX_GROUP_NAME = 255


@dataclass(frozen=True)
class Event:
    """One create or delete of the workload."""

    time: float
    kind: str
    id: str
    flavor: str | None = None
    image: str | None = None
    num: int = 1
    group: str | None = None
    policy: str | None = None
    hints: dict[str, list[str]] = field(default_factory=dict)
    project: str | None = None
    availability_zone: str | None = None
    #: Where the event comes from in its file ("line 12", "vm 345"), for messages.
    origin: str | None = field(default=None, compare=False, repr=False)

    def at(self) -> str:
        """``'web-3' at t=20 (line 12)``: the event, for a message."""
        return f"{self.id!r} at t={self.time:g}" + (f" ({self.origin})" if self.origin else "")


@dataclass
class Trace:
    """Events in time order, with the flavors the trace itself defines (Azure's VM
    types), by name: ``{"vcpus", "memory_mb", "root_gb"}``."""

    events: list[Event]
    flavors: dict[str, dict[str, int]] = field(default_factory=dict)
    source: str = ""

    @property
    def duration(self) -> float:
        """Seconds from the first event to the last."""
        return self.events[-1].time - self.events[0].time if self.events else 0.0

    def creates(self) -> int:
        """The number of create events."""
        return sum(1 for e in self.events if e.kind == CREATE)


def load_trace(path: str, *, machine: AzureMachine | None = None,
               machine_id: int | None = None, limit: int | None = None) -> Trace:
    """The trace at ``path``: CSV, or the Azure packing trace (SQLite) by extension or
    content."""
    p = Path(path)
    if not p.is_file():
        raise InputError(f"trace: no such file {path!r}", field="trace")
    with p.open("rb") as fh:
        head = fh.read(16)
    if head.startswith(b"SQLite format 3"):
        return read_azure(path, machine=machine, machine_id=machine_id, limit=limit)
    return read_csv(path, limit=limit)


def events_at_most(path: str, *, limit: int | None = None) -> int:
    """At most how many requests and instances :func:`load_trace` gives for ``path`` (a
    CSV row is one, or its ``num`` instances; an Azure VM two), without building the
    events; 0 when the file cannot be read (the load says why). It sizes the scratch
    store before the trace itself is loaded (an Azure trace's sizes need the cloud)."""
    try:
        with open(path, "rb") as fh:
            azure = fh.read(16).startswith(b"SQLite format 3")
        if azure:
            db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
            try:
                vms = int(db.execute("SELECT COUNT(*) FROM vm").fetchone()[0])
            finally:
                db.close()
            return 2 * (vms if limit is None else min(vms, limit))
        total = 0
        with open(path, newline="", encoding="utf-8-sig", errors="replace") as text:
            rows = csv.reader(_without_comments(text))
            header = next(rows, [])
            at = header.index("num") if "num" in header else None
            for n, row in enumerate(rows):
                if limit is not None and n >= limit:
                    break
                num = row[at].strip() if at is not None and at < len(row) else ""
                total += min(max(1, int(num)), MAX_INSTANCES_PER_REQUEST) if num.isdigit() else 1
    except (OSError, sqlite3.Error, csv.Error):
        return 0
    return total


# ----------------------------------------------------------------------------- CSV
def read_csv(path: str, *, limit: int | None = None) -> Trace:
    """Read a CSV trace (see the module's docstring); events sorted by time, those at
    the same instant in the file's order."""
    try:
        # utf-8-sig: a byte order mark (as some spreadsheets write) is not part of the header.
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(_csv_rows(fh, path, limit))
    except UnicodeDecodeError as exc:
        raise InputError(f"trace {path}: not UTF-8 text ({exc.reason})", field="trace") from None
    except csv.Error as exc:
        raise InputError(f"trace {path}: not CSV ({exc})", field="trace") from None
    events = sorted(rows, key=lambda e: e.time)  # stable: the file's order at one instant
    check_ids(events, path)
    return Trace(events, source=path)


def _csv_rows(fh: Iterable[str], path: str, limit: int | None) -> Iterator[Event]:
    reader = csv.DictReader(_without_comments(fh))
    if reader.fieldnames is None:
        raise InputError(f"trace {path}: empty: no header row (columns: {','.join(COLUMNS)})",
                         field="trace")
    header = reader.fieldnames
    missing = [c for c in REQUIRED if c not in header]
    if missing:
        raise InputError(f"trace {path}: the header has no {', '.join(missing)} column "
                         f"(columns: {','.join(COLUMNS)})", field="trace")
    unknown = [c for c in header if c not in COLUMNS]
    if unknown:
        raise InputError(f"trace {path}: unknown column {unknown[0]!r} (columns: "
                         f"{','.join(COLUMNS)})", field="trace")
    twice = [c for i, c in enumerate(header) if c in header[:i]]
    if twice:
        raise InputError(f"trace {path}: the header names column {twice[0]!r} twice",
                         field="trace")
    for count, row in enumerate(reader):
        if limit is not None and count >= limit:
            return
        event = parse_row(row, f"trace {path} line {reader.line_num}")
        yield replace(event, origin=f"line {reader.line_num}")


def _without_comments(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        if not line.lstrip().startswith("#") and line.strip():
            yield line


def parse_row(row: dict[str, Any], where: str) -> Event:
    """One CSV row as an :class:`Event`; InputError naming ``where`` and the column."""
    def text(col: str) -> str | None:
        value = row.get(col)
        if value is None:
            return None
        value = str(value).strip()
        return value or None

    if None in row:  # more cells than header columns
        raise InputError(f"{where}: more cells than the header has columns", field="trace")
    raw_time = text("time")
    try:
        time = float(raw_time) if raw_time is not None else math.nan
    except ValueError:
        time = math.nan
    if not math.isfinite(time) or time < 0:
        raise InputError(f"{where}: time: expected seconds >= 0, got {raw_time!r}",
                         field="trace")
    kind = text("event")
    if kind not in (CREATE, DELETE):
        raise InputError(f"{where}: event: expected 'create' or 'delete', got {kind!r}",
                         field="trace")
    ident = text("id")
    if ident is None:
        raise InputError(f"{where}: id: missing", field="trace")
    if kind == DELETE:
        return Event(time, DELETE, ident)
    flavor = text("flavor")
    if flavor is None:
        raise InputError(f"{where}: flavor: a create needs one", field="trace")
    raw_num = text("num")
    try:
        num = int(raw_num) if raw_num is not None else 1
    except ValueError:
        num = 0
    if not 1 <= num <= MAX_INSTANCES_PER_REQUEST:
        raise InputError(f"{where}: num: expected an integer from 1 to "
                         f"{MAX_INSTANCES_PER_REQUEST}, got {raw_num!r}", field="trace")
    group = text("group")
    if group is not None and len(group) > MAX_GROUP_NAME:
        raise InputError(f"{where}: group: expected a name of at most {MAX_GROUP_NAME} "
                         f"characters, got {len(group)}", field="trace")
    policy = text("policy")
    if policy is not None and policy not in InstanceGroup.VALID_POLICIES:
        raise InputError(f"{where}: policy: expected one of "
                         f"{', '.join(InstanceGroup.VALID_POLICIES)}, got {policy!r}",
                         field="trace")
    return Event(time, CREATE, ident, flavor=flavor, image=text("image"), num=num,
                 group=group, policy=policy, hints=parse_hints(text("hints"), where),
                 project=text("project"), availability_zone=text("availability_zone"))


def parse_hints(raw: str | None, where: str) -> dict[str, list[str]]:
    """A JSON object of scheduler hints; each value a string or a list of strings."""
    if raw is None:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise InputError(f"{where}: hints: not a JSON object: {raw[:60]!r}",
                         field="trace") from None
    if not isinstance(value, dict):
        raise InputError(f"{where}: hints: expected a JSON object, got {raw[:60]!r}",
                         field="trace")
    hints: dict[str, list[str]] = {}
    for key, v in value.items():
        if key == "availability_zone":
            # A hint no filter reads (Nova takes the zone as the server's attribute):
            # the boot would go anywhere.
            raise InputError(f"{where}: hints.availability_zone: a zone is not a scheduler "
                             "hint; give it in the availability_zone column", field="trace")
        items = v if isinstance(v, list) else [v]
        if not all(isinstance(i, str) for i in items):
            raise InputError(f"{where}: hints.{key}: expected a string or a list of "
                             f"strings, got {v!r}", field="trace")
        hints[key] = list(items)
    return hints


def check_ids(events: list[Event], where: str) -> None:
    """A create's id is not live already; a delete names a live id; a ``same_host`` /
    ``different_host`` hint names an earlier id or an instance uuid (an InputError
    otherwise, so a typo cannot pass silently or stop a replay half way)."""
    live: set[str] = set()
    seen: set[str] = set()
    for e in events:
        if e.kind == CREATE:
            for key in INSTANCE_HINTS:
                for value in e.hints.get(key, []):
                    if value not in seen and not _is_uuid(value):
                        raise InputError(
                            f"trace {where}: {e.at()}: hints.{key}: {value!r} is neither an "
                            "earlier id of the trace nor an instance uuid", field="trace")
            seen.add(e.id)
            if e.id in live:
                raise InputError(f"trace {where}: {e.at()}: created while still live",
                                 field="trace")
            live.add(e.id)
        else:
            if e.id not in live:
                raise InputError(f"trace {where}: delete of {e.at()}: no live create with "
                                 "that id before it", field="trace")
            live.discard(e.id)


def _is_uuid(value: str) -> bool:
    try:
        uuidlib.UUID(value)
    except ValueError:
        return False
    return True


def write_csv(trace: Trace, path: str) -> None:
    """Write ``trace`` in the CSV format (what :func:`read_csv` reads back)."""
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(COLUMNS)
        for e in trace.events:
            writer.writerow([f"{e.time:.3f}", e.kind, e.id, e.flavor or "", e.image or "",
                             e.num if e.kind == CREATE else "", e.group or "",
                             e.policy or "", json.dumps(e.hints) if e.hints else "",
                             e.project or "", e.availability_zone or ""])


# ----------------------------------------------------------------------------- Azure
@dataclass(frozen=True)
class AzureMachine:
    """The machine the Azure trace's fractions are fractions of."""

    vcpus: int
    memory_mb: int
    disk_gb: int

    @classmethod
    def parse(cls, text: str) -> AzureMachine:
        """``VCPUS,MEMORY_MB,DISK_GB``."""
        parts = text.split(",")
        try:
            values = [int(p) for p in parts]
        except ValueError:
            values = []
        if len(values) != 3 or min(values) < 1:
            raise InputError(f"--azure-machine: expected VCPUS,MEMORY_MB,DISK_GB (positive "
                             f"integers), got {text!r}", field="--azure-machine")
        return cls(*values)


def read_azure(path: str, *, machine: AzureMachine | None = None,
               machine_id: int | None = None, limit: int | None = None) -> Trace:
    """Read the Azure packing trace 2020 (SQLite). VMs that started before the trace
    (negative ``starttime``) start at 0; a NULL ``endtime`` is never deleted. ``limit``
    keeps the first VMs by start time."""
    if machine is None:
        raise InputError("--azure-machine: the trace's sizes are fractions of a machine; give "
                         "VCPUS,MEMORY_MB,DISK_GB (with a cloud file, its most common compute "
                         "node is the default)", field="--azure-machine")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as exc:
        raise InputError(f"trace {path}: cannot open as SQLite ({exc})", field="trace") from None
    try:
        names, sizes, chosen = _azure_types(db, path, machine, machine_id)
        query = "SELECT vmId, tenantId, vmTypeId, starttime, endtime FROM vm ORDER BY starttime, vmId"
        if limit is not None:
            query += f" LIMIT {int(limit)}"
        try:
            rows = db.execute(query).fetchall()
        except sqlite3.Error as exc:
            raise InputError(f"trace {path}: table vm: {exc} (expected columns vmId, "
                             "tenantId, vmTypeId, priority, starttime, endtime)",
                             field="trace") from None
    finally:
        db.close()
    events: list[Event] = []
    for vm_id, tenant, type_id, start, end in rows:
        where = f"trace {path} vm {vm_id}"
        if vm_id is None:
            raise InputError(f"trace {path}: table vm: a row with starttime {start!r} has no "
                             "vmId", field="trace")
        name = names.get(type_id)
        if name is None:
            raise InputError(f"{where}: vmTypeId {type_id!r} has no vmType row for "
                             f"machineId {chosen}", field="trace")
        raw_begin = _days(start, f"{where}: starttime")
        assert raw_begin is not None
        begin = max(0.0, raw_begin)
        events.append(Event(begin, CREATE, str(vm_id), flavor=name,
                            project=None if tenant is None else str(tenant)))
        finish = _days(end, f"{where}: endtime", allow_null=True)
        if finish is not None:
            if finish < raw_begin:  # a VM that ends before it starts: the row is wrong
                raise InputError(f"{where}: endtime {end!r} is before starttime {start!r}",
                                 field="trace")
            events.append(Event(max(begin, finish), DELETE, str(vm_id)))
    # A delete at the same instant as a create goes after it (a zero-length VM).
    events.sort(key=lambda e: (e.time, e.kind == DELETE))
    check_ids(events, path)  # a vmId twice, live at once, would leak its first instance
    used = {e.flavor for e in events}
    return Trace(events, flavors={n: s for n, s in sizes.items() if n in used}, source=path)


def _azure_types(db: sqlite3.Connection, path: str, machine: AzureMachine,
                 machine_id: int | None) -> tuple[dict[Any, str], dict[str, dict[str, int]], Any]:
    """vmTypeId -> flavor name, the flavors' sizes, and the machineId whose rows were
    used (``machine_id``, or the one with the most VM types)."""
    try:
        rows = db.execute("SELECT rowid, vmTypeId, machineId, core, memory, hdd, ssd "
                          "FROM vmType").fetchall()
    except sqlite3.Error as exc:
        raise InputError(f"trace {path}: table vmType: {exc} (expected columns id, "
                         "vmTypeId, machineId, core, memory, hdd, ssd, nic)",
                         field="trace") from None
    if not rows:
        raise InputError(f"trace {path}: table vmType is empty", field="trace")
    rows = [(type_id, _machine_id(mid, f"trace {path}: table vmType, column machineId, row "
                                       f"{rowid} (vmTypeId {type_id})"), *rest)
            for rowid, type_id, mid, *rest in rows]
    per_machine: dict[int, int] = {}
    for _, mid, *_ in rows:
        per_machine[mid] = per_machine.get(mid, 0) + 1
    if machine_id is None:
        chosen = max(per_machine, key=lambda m: (per_machine[m], -m))
    elif machine_id in per_machine:
        chosen = machine_id
    else:
        raise InputError(f"--azure-machine-id: {machine_id} is not a machineId of the trace "
                         f"(it has {', '.join(str(m) for m in sorted(per_machine))})",
                         field="--azure-machine-id")
    names: dict[Any, str] = {}
    sizes: dict[str, dict[str, int]] = {}
    for type_id, mid, core, memory, hdd, ssd in rows:
        if mid != chosen:
            continue
        where = f"trace {path} vmType {type_id} machine {mid}"
        # A type without cores or memory is a broken row; no disk is 0.
        fractions = [_fraction(v, f"{where}: {col}", allow_null=col in ("hdd", "ssd"))
                     for v, col in ((core, "core"), (memory, "memory"), (hdd, "hdd"),
                                    (ssd, "ssd"))]
        name = f"azure-{type_id}"
        names[type_id] = name
        sizes[name] = {
            "vcpus": max(1, math.ceil(fractions[0] * machine.vcpus - 1e-9)),
            "memory_mb": max(1, math.ceil(fractions[1] * machine.memory_mb - 1e-9)),
            "root_gb": math.ceil(max(fractions[2], fractions[3]) * machine.disk_gb - 1e-9),
        }
    return names, sizes, chosen


def _machine_id(value: Any, where: str) -> int:
    """A ``vmType.machineId``: an integer (SQLite may hold it as an integral REAL)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, int):
        raise InputError(f"{where}: expected an integer, got {value!r}", field="trace")
    return value


def _fraction(value: Any, where: str, allow_null: bool = False) -> float:
    if value is None and allow_null:
        return 0.0
    try:
        f = float(value)
    except (TypeError, ValueError):
        f = math.nan
    if not math.isfinite(f) or not 0.0 <= f <= 1.0:
        raise InputError(f"{where}: expected a fraction of the machine (0 to 1), got "
                         f"{value!r}", field="trace")
    return f


def _days(value: Any, where: str, allow_null: bool = False) -> float | None:
    if value is None and allow_null:
        return None
    try:
        days = float(value)
    except (TypeError, ValueError):
        days = math.nan
    if not math.isfinite(days):
        raise InputError(f"{where}: expected fractional days, got {value!r}", field="trace")
    return days * DAY
