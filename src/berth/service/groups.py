"""Server groups of ``berth serve``: stored in the shared database, resolved for a boot.

Nova keeps server groups in its API database: the API resolves the ``group`` scheduler
hint to the group and adds the new instances to its members, and the conductor fills in
the hosts the members run on (``setup_instance_group``) before the scheduler's
affinity filters read them. Berth stores a group's uuid, name, policy and rules in
table ``berth_server_groups`` and its members one row each in
``berth_server_group_members``, as Nova's ``instance_group_member`` (both created with
``create_all``, beside the compute records; a member is found by its instance uuid
through an index, and joining or leaving writes only its own row), and derives
``hosts`` at every request from where the members are
*claimed*: the Placement allocations of the member consumers, mapped from their root
provider (the compute node) to its host (:class:`ClaimedHosts`). Claims live in the
shared database and are written before a build starts, so every scheduler and API
process sees the same placements, including builds still in flight in another process;
what a host's agent last reported does not enter (Nova reads ``instance.host``, which
its compute service sets when the build reaches it; see the deliberate deviations in
docs/architecture.md).

Every transaction here is retried when the database connection is lost and a retry is
safe (:mod:`berth.placement.dbfaults`): reads, and member edits, which are idempotent.

Groups come from a cloud file's ``server_groups`` (``berth serve --cloud``). A boot into
a group adds its instances to the members before they are scheduled, as Nova's API
does, so a concurrent boot's late check counts them once they run
(:meth:`ServerGroupStore.add_members`); the instances that end up not built leave the
group again (:meth:`ServerGroupStore.remove_members`). Nova keeps a failed instance as a
member until the instance is deleted; Berth keeps no instance that was not built.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.errors import InputError
from berth.model.request import InstanceGroup
from berth.placement.db import create_tables, lock_schema
from berth.placement.dbfaults import retried
from berth.placement.store_raw import RawConnection, RawPool, Unexpected, marks, raw_pool
from berth.service.builds import BUILDING, builds, builds_metadata
from berth.service.instances import instances_metadata
from berth.service.records import records_metadata

groups_metadata = sa.MetaData()

server_groups = sa.Table(
    "berth_server_groups",
    groups_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False, index=True),
    sa.Column("policy", sa.String(32), nullable=False),
    sa.Column("rules", sa.Text, nullable=False),
    sa.Column("project_id", sa.String(255), nullable=True),
    sa.Column("user_id", sa.String(255), nullable=True),
)

#: One row per member; ``id`` keeps the order members joined in.
group_members = sa.Table(
    "berth_server_group_members",
    groups_metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("group_uuid", sa.String(36), nullable=False),
    sa.Column("instance_uuid", sa.String(36), nullable=False),
    sa.UniqueConstraint("group_uuid", "instance_uuid",
                        name="uniq_berth_server_group_members0group0instance"),
    sa.Index("berth_server_group_members_instance_idx", "instance_uuid"),
)


#: The statements of the hot paths (a boot into a group, a delete, the late check), as
#: raw DBAPI statements on the engine's kept connections
#: (:class:`~berth.placement.store_raw.RawPool`): building SQLAlchemy statements and
#: their cache keys per call cost more than running them.
_GROUP_COLUMNS = "uuid, name, policy, rules, project_id, user_id"
_RAW_GROUP = f"SELECT {_GROUP_COLUMNS} FROM berth_server_groups WHERE uuid = ?"
#: A group by uuid or by name, in one read (:meth:`ServerGroupStore.find` sorts it out).
_RAW_FIND_GROUP = _RAW_GROUP + " OR name = ?"
_RAW_ALL_GROUPS = f"SELECT {_GROUP_COLUMNS} FROM berth_server_groups ORDER BY name, uuid"
#: The groups an instance is a member of (the members' instance index).
_RAW_GROUPS_OF = (
    "SELECT g.uuid, g.name, g.policy, g.rules, g.project_id, g.user_id "
    "FROM berth_server_group_members m JOIN berth_server_groups g ON g.uuid = m.group_uuid "
    "WHERE m.instance_uuid = ? ORDER BY g.uuid"
)
#: The members of the given groups, each group's in the order they joined.
_RAW_MEMBERS_OF = ("SELECT group_uuid, instance_uuid FROM berth_server_group_members "
                   "WHERE group_uuid IN ({}) ORDER BY id")
_RAW_ALL_MEMBERS = "SELECT group_uuid, instance_uuid FROM berth_server_group_members ORDER BY id"
_RAW_JOIN = ("INSERT INTO berth_server_group_members (group_uuid, instance_uuid) VALUES (?, ?) "
             "ON CONFLICT (group_uuid, instance_uuid) DO NOTHING")
_RAW_LEAVE = ("DELETE FROM berth_server_group_members WHERE group_uuid = ? "
              "AND instance_uuid IN ({})")
_RAW_LEAVE_ALL = "DELETE FROM berth_server_group_members WHERE instance_uuid = ?"
#: 1 when the group exists (0 otherwise: run with ``expect``, nothing after it is written).
_RAW_GROUP_EXISTS = "SELECT COUNT(*) FROM berth_server_groups WHERE uuid = ?"
#: A group's definition, new or replacing the stored one (processes that load one cloud
#: file together write the same group at once).
_RAW_PUT_GROUP = (
    "INSERT INTO berth_server_groups (uuid, name, policy, rules, project_id, user_id) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (uuid) DO UPDATE SET name = excluded.name, "
    "policy = excluded.policy, rules = excluded.rules, project_id = excluded.project_id, "
    "user_id = excluded.user_id"
)
#: Where instances are claimed (:class:`ClaimedHosts`): the host of the compute node
#: (root provider) each one's allocations are against, from the node's compute record,
#: else the provider's name.
_RAW_CLAIMED = (
    "SELECT DISTINCT a.consumer_id, COALESCE(cn.host, root.name) FROM allocations a "
    "JOIN resource_providers rp ON rp.id = a.resource_provider_id "
    "JOIN resource_providers root ON root.id = COALESCE(rp.root_provider_id, rp.id) "
    "LEFT OUTER JOIN berth_compute_nodes cn ON cn.uuid = root.uuid"
)
_RAW_CLAIMED_HOSTS = _RAW_CLAIMED + " WHERE a.consumer_id IN ({})"
#: The specs Berth keeps of instances: an instance's row, else its build record's while
#: it builds (:meth:`ServerGroupStore.flavors_of`).
_RAW_MEMBER_SPECS = (
    "SELECT uuid, spec FROM berth_instances WHERE uuid IN ({}) UNION ALL "
    "SELECT instance_uuid, spec FROM berth_builds WHERE spec IS NOT NULL "
    "AND instance_uuid IN ({})"
)
#: Members checked in by the late group check: not a build of Berth's (no record), or
#: past ``building``, or admitted to a host while building (the first mark: BUILDING).
_RAW_ADMITTED_HOSTS = (
    _RAW_CLAIMED + " LEFT OUTER JOIN berth_builds b ON b.instance_uuid = a.consumer_id "
    "WHERE (b.state IS NULL OR b.state != ? OR b.host IS NOT NULL) AND a.consumer_id IN ({})"
)
_RAW_ADMIT_BUILD = (
    "UPDATE berth_builds SET host = ? WHERE instance_uuid = ? AND state = ?"
)
#: Group uuids per query when reading members.
_CHUNK = 500


def _bare(row: Sequence[Any]) -> InstanceGroup:
    """A row of ``berth_server_groups`` (:data:`_GROUP_COLUMNS`) as a group, its
    members not read yet."""
    uuid, name, policy, rules, project_id, user_id = row
    return InstanceGroup(policy=policy, uuid=uuid, name=name, rules=json.loads(rules),
                         members=[], project_id=project_id, user_id=user_id)


def _groups(raw: RawConnection | RawPool, rows: Sequence[Sequence[Any]]) -> list[InstanceGroup]:
    """Rows of ``berth_server_groups`` (:data:`_GROUP_COLUMNS`) as groups, in their
    order, each with its members read on ``raw``."""
    groups = [_bare(row) for row in rows]
    by_uuid = {g.uuid: g for g in groups}
    uuids = list(by_uuid)
    for i in range(0, len(uuids), _CHUNK):
        chunk = uuids[i:i + _CHUNK]
        for group_uuid, instance_uuid in raw.run(
                [(_RAW_MEMBERS_OF.format(marks(len(chunk))), chunk)])[0]:
            by_uuid[group_uuid].members.append(instance_uuid)
    return groups


def _begin(raw: RawConnection) -> str:
    """The statement that opens a writing transaction on ``raw`` (SQLite: the write
    lock at once, so that two writers do not both read first and then deadlock)."""
    return "BEGIN" if raw.pg else "BEGIN IMMEDIATE"


def move_member_lists(engine: Engine) -> None:
    """Move the members of a database written by an earlier Berth, which kept each
    group's members as a JSON list in a ``members`` column of ``berth_server_groups``,
    to ``berth_server_group_members`` (in their order), and drop that column. Runs under
    the lock of :func:`~berth.placement.db.create_tables`, so processes starting
    together move them once."""
    if "members" not in {c["name"] for c in sa.inspect(engine).get_columns(server_groups.name)}:
        return
    with engine.connect().execution_options(immediate=True) as conn, conn.begin():
        lock_schema(conn)
        columns = {c["name"] for c in sa.inspect(conn).get_columns(server_groups.name)}
        if "members" not in columns:
            return  # another process moved them meanwhile
        rows = conn.execute(sa.text("SELECT uuid, members FROM berth_server_groups")).all()
        joined = [{"group_uuid": uuid, "instance_uuid": str(member)}
                  for uuid, members in rows
                  for member in dict.fromkeys(json.loads(members or "[]"))]
        if joined:
            conn.execute(sa.insert(group_members), joined)
        conn.execute(sa.text("ALTER TABLE berth_server_groups DROP COLUMN members"))


class ClaimedHosts:
    """Where instances are placed, as their claims say: an
    :class:`~berth.service.group_check.InstanceLocator` over the shared database.

    An instance is on the host of the compute node (root provider) its allocations are
    against, from the moment its claim is written until the claim is deleted; the host
    name comes from the node's compute record (the provider's name when there is
    none). An instance without allocations is nowhere.
    """

    #: Members looked up per query.
    CHUNK = 500

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._raw = raw_pool(engine)

    @retried(safe=True)
    def hosts_of(self, instance_uuids: Iterable[str]) -> dict[str, str]:
        """The host each instance is claimed on; those without a claim are left out."""
        return self.on(self._raw, instance_uuids, admitted=False)

    def on(self, raw: RawConnection | RawPool, instance_uuids: Iterable[str], *,
           admitted: bool) -> dict[str, str]:
        """:meth:`hosts_of` on ``raw`` (a connection: inside its transaction, if one is
        open; the pool: each read on a kept connection); with ``admitted``, only the
        instances that passed the late group check (or that Berth did not build)."""
        wanted = list(dict.fromkeys(instance_uuids))
        where: dict[str, str] = {}
        query = _RAW_ADMITTED_HOSTS if admitted else _RAW_CLAIMED_HOSTS
        for i in range(0, len(wanted), self.CHUNK):
            chunk = wanted[i:i + self.CHUNK]
            params = [BUILDING, *chunk] if admitted else chunk
            for consumer, host in raw.run([(query.format(marks(len(chunk))), params)])[0]:
                where.setdefault(str(consumer), str(host))
        return where


class ServerGroupStore:
    """Server groups in SQL; a boot's instances join before it is scheduled and those
    not built leave after it (a multi-create adds several)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._raw = raw_pool(engine)
        create_tables(engine, groups_metadata)
        move_member_lists(engine)
        # ClaimedHosts reads host names and build states there; flavors_of the specs.
        create_tables(engine, records_metadata)
        create_tables(engine, builds_metadata)  # (BuildRecords adds its spec column)
        create_tables(engine, instances_metadata)
        self.placements = ClaimedHosts(engine)

    @retried(safe=True)
    def put(self, group: InstanceGroup) -> None:
        """Store ``group`` (by uuid): name, policy and rules as given; the members stored
        already stay members (instances booted into it before a restart), and those of
        ``group`` join after them."""
        self._write([
            (_RAW_PUT_GROUP, (group.uuid, group.name, group.policy,
                              json.dumps(group.rules, sort_keys=True), group.project_id,
                              group.user_id)),
            *[(_RAW_JOIN, (group.uuid, m)) for m in dict.fromkeys(group.members)]])

    @retried(safe=True)
    def all(self) -> list[InstanceGroup]:
        """Every group, by name then uuid."""
        raw = self._raw.take()
        ok = False
        try:
            groups = [_bare(row) for row in raw.run([(_RAW_ALL_GROUPS, ())])[0]]
            by_uuid = {g.uuid: g for g in groups}
            for group_uuid, instance_uuid in raw.run([(_RAW_ALL_MEMBERS, ())])[0]:
                group = by_uuid.get(group_uuid)
                if group is not None:  # a group created after the first read
                    group.members.append(instance_uuid)
            ok = True
            return groups
        finally:
            self._raw.give(raw, ok)

    @retried(safe=True)
    def of_member(self, instance_uuid: str) -> list[InstanceGroup]:
        """The groups ``instance_uuid`` is a member of, by uuid."""
        return _groups(self._raw, self._raw.run([(_RAW_GROUPS_OF, (instance_uuid,))])[0])

    @retried(safe=True)
    def leave(self, instance_uuid: str) -> int:
        """``instance_uuid`` leaves every group it is a member of (a deleted instance);
        the number of groups it left."""
        return int(self._raw.run(self.leaving(instance_uuid))[0])

    @staticmethod
    def leaving(instance_uuid: str) -> list[tuple[str, tuple[str]]]:
        """The raw statements of :meth:`leave`, for a transaction of the caller's on this
        store's database (a deleted instance's row goes in the same one)."""
        return [(_RAW_LEAVE_ALL, (instance_uuid,))]

    @retried(safe=True)
    def get(self, uuid: str) -> InstanceGroup | None:
        """The group ``uuid`` as stored now, or None."""
        found = _groups(self._raw, self._raw.run([(_RAW_GROUP, (uuid,))])[0])
        return found[0] if found else None

    @retried(safe=True)
    def find(self, ref: str) -> list[InstanceGroup]:
        """The group whose uuid is ``ref``, else every group named ``ref`` (by uuid)."""
        rows = self._raw.run([(_RAW_FIND_GROUP, (ref, ref))])[0]
        by_uuid = [r for r in rows if r[0] == ref]
        return _groups(self._raw, by_uuid or sorted(rows, key=lambda r: str(r[0])))

    def resolve(self, ref: str, *, field: str = "hints.group") -> InstanceGroup:
        """The group ``ref`` (a uuid or a unique name) with ``hosts`` and
        ``member_hosts``: where its members are claimed now (and ``member_flavors``:
        their flavor ids). An InputError naming ``field`` when there is no such group or
        the name is ambiguous."""
        found = self.find(ref)
        if not found:
            known = ", ".join(g.name or g.uuid for g in self.all()) or "none"
            raise InputError(f"{field}: no server group named or with uuid {ref!r} "
                             f"(known: {known})", field=field)
        if len(found) > 1:
            raise InputError(f"{field}: {len(found)} server groups are named {ref!r}; give "
                             f"the uuid of one of {', '.join(g.uuid for g in found)}",
                             field=field)
        group = found[0]
        group.member_hosts = self.placements.hosts_of(group.members)
        group.hosts = sorted(set(group.member_hosts.values()))
        group.member_flavors = self.flavors_of(group.member_hosts)
        return group

    @retried(safe=True)
    def flavors_of(self, instance_uuids: Iterable[str]) -> dict[str, Any]:
        """The flavor id of each of these instances that Berth built or builds (from the
        spec its instance row, or its build record while it builds, keeps)."""
        wanted = list(dict.fromkeys(instance_uuids))
        found: dict[str, Any] = {}
        for i in range(0, len(wanted), ClaimedHosts.CHUNK):
            chunk = wanted[i:i + ClaimedHosts.CHUNK]
            for uuid, spec in self._raw.run([(_RAW_MEMBER_SPECS.format(
                    marks(len(chunk)), marks(len(chunk))), [*chunk, *chunk])])[0]:
                if spec and str(uuid) not in found:
                    found[str(uuid)] = json.loads(spec).get("flavor", {}).get("id")
        return found

    @retried(safe=True)
    def add_members(self, uuid: str, members: Iterable[str]) -> None:
        """Add instances to a group's members (each once, after those there already),
        atomically; an InputError when there is no such group."""
        new = list(dict.fromkeys(members))
        if not new:
            return
        try:
            self._write([(_RAW_GROUP_EXISTS, (uuid,), True),
                         *[(_RAW_JOIN, (uuid, m)) for m in new]])
        except Unexpected:
            raise InputError(f"server group {uuid}: no such group") from None

    @retried(safe=True)
    def remove_members(self, uuid: str, members: Iterable[str]) -> None:
        """Remove instances from a group's members, atomically; a group that is gone
        meanwhile has nothing left to remove."""
        gone = list(dict.fromkeys(members))
        if gone:
            self._write([(_RAW_LEAVE.format(marks(len(chunk))), (uuid, *chunk))
                         for chunk in (gone[i:i + _CHUNK] for i in range(0, len(gone), _CHUNK))])

    @retried(safe=False)
    def admit(self, uuid: str, instance_uuid: str, host: str,
              decide: Callable[[InstanceGroup, dict[str, str]], None]) -> None:
        """The late group check's transaction: under the group's row lock (every
        process's checks of this group take turns), read the group and the hosts its
        other checked-in members are claimed on, let ``decide`` raise to refuse, then
        record ``instance_uuid`` as checked in on ``host`` (its build record). A group
        that is gone has nothing to check."""
        raw = self._raw.take()
        ok = False
        try:
            lock = _RAW_GROUP + " FOR UPDATE" if raw.pg else _RAW_GROUP
            row = raw.run([(_begin(raw), ()), (lock, (uuid,))])[1]
            if row:
                group = _groups(raw, row)[0]
                others = [m for m in group.members if m != instance_uuid]
                decide(group, self.placements.on(raw, others, admitted=True) if others else {})
                raw.run([(_RAW_ADMIT_BUILD, (host, instance_uuid, BUILDING))])
            raw.run([("COMMIT", ())])
            ok = True
        finally:
            self._raw.give(raw, ok)  # an open transaction (a refusal) is rolled back

    @retried(safe=True)
    def withdraw(self, instance_uuid: str) -> None:
        """Undo :meth:`admit` for a build that failed after its check (it goes on to an
        alternate, or fails)."""
        with self.engine.begin() as conn:
            conn.execute(sa.update(builds).where(builds.c.instance_uuid == instance_uuid,
                                                 builds.c.state == BUILDING)
                         .values(host=None))

    def _write(self, stmts: Sequence[tuple[Any, ...]]) -> None:
        """``stmts`` in one transaction on a kept connection, in one round trip (a
        statement with ``expect`` that fails leaves nothing written)."""
        raw = self._raw.take()
        ok = False
        try:
            raw.run([(_begin(raw), ()), *stmts, ("COMMIT", ())])
            ok = True
        finally:
            self._raw.give(raw, ok)  # an open transaction (an error) is rolled back
