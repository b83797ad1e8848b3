"""Server groups of ``berth serve``: stored in the shared database, resolved for a boot.

Nova keeps server groups in its API database: the API resolves the ``group`` scheduler
hint to the group and adds the new instances to its members, and the conductor fills in
the hosts the members run on (``setup_instance_group``) before the scheduler's
affinity filters read them. Berth stores a group's uuid, name, policy, rules and
members in table ``berth_server_groups`` (created with ``create_all``, beside the
compute records) and derives ``hosts`` at every request from where the members are
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
from berth.placement.db import create_tables
from berth.placement.dbfaults import retried
from berth.placement.store_raw import RawConnection, RawPool, marks, raw_pool
from berth.service.builds import BUILDING, builds, builds_metadata
from berth.service.records import records_metadata

groups_metadata = sa.MetaData()

server_groups = sa.Table(
    "berth_server_groups",
    groups_metadata,
    sa.Column("uuid", sa.String(36), primary_key=True),
    sa.Column("name", sa.String(255), nullable=False, index=True),
    sa.Column("policy", sa.String(32), nullable=False),
    sa.Column("rules", sa.Text, nullable=False),
    sa.Column("members", sa.Text, nullable=False),
    sa.Column("project_id", sa.String(255), nullable=True),
    sa.Column("user_id", sa.String(255), nullable=True),
)


#: The statements a delete and a group's member edits run, built once (building a
#: statement and its cache key per call cost more than running it).
#: :meth:`ServerGroupStore.of_member` (every delete asks) as a raw DBAPI statement on
#: the engine's kept connections (:class:`~berth.placement.store_raw.RawPool`).
_RAW_WITH_MEMBER = (
    "SELECT uuid, name, policy, rules, members, project_id, user_id FROM berth_server_groups "
    "WHERE members LIKE ? ESCAPE '/'"
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
#: Members checked in by the late group check: not a build of Berth's (no record), or
#: past ``building``, or admitted to a host while building (the first mark: BUILDING).
_RAW_ADMITTED_HOSTS = (
    _RAW_CLAIMED + " LEFT OUTER JOIN berth_builds b ON b.instance_uuid = a.consumer_id "
    "WHERE (b.state IS NULL OR b.state != ? OR b.host IS NOT NULL) AND a.consumer_id IN ({})"
)
_RAW_GROUP = (
    "SELECT uuid, name, policy, rules, members, project_id, user_id FROM berth_server_groups "
    "WHERE uuid = ?"
)
#: A group by uuid or by name, in one read (:meth:`ServerGroupStore.find` sorts it out).
_RAW_FIND_GROUP = _RAW_GROUP + " OR name = ?"
_RAW_ADMIT_BUILD = (
    "UPDATE berth_builds SET host = ? WHERE instance_uuid = ? AND state = ?"
)
_MEMBERS_FOR_UPDATE = (sa.select(server_groups.c.members)
                       .where(server_groups.c.uuid == sa.bindparam("b_uuid")).with_for_update())
_SET_MEMBERS = (sa.update(server_groups).where(server_groups.c.uuid == sa.bindparam("b_uuid"))
                .values(members=sa.bindparam("members")))


def _containing(text: str) -> str:
    """A LIKE pattern matching any value that contains ``text`` (escaped with ``/``)."""
    escaped = text.replace("/", "//").replace("%", "/%").replace("_", "/_")
    return f"%{escaped}%"


def _group(row: Sequence[Any]) -> InstanceGroup:
    """A row of ``berth_server_groups`` (its columns in the table's order)."""
    uuid, name, policy, rules, members, project_id, user_id = row
    return InstanceGroup(policy=policy, uuid=uuid, name=name, rules=json.loads(rules),
                         members=list(json.loads(members)), project_id=project_id,
                         user_id=user_id)


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
        # ClaimedHosts reads host names and build states there.
        create_tables(engine, records_metadata)
        create_tables(engine, builds_metadata)
        self.placements = ClaimedHosts(engine)

    @retried(safe=True)
    def put(self, group: InstanceGroup) -> None:
        """Store ``group`` (by uuid): name, policy and rules as given; the members stored
        already stay members (instances booted into it before a restart)."""
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            stored = conn.execute(sa.select(server_groups.c.members)
                                  .where(server_groups.c.uuid == group.uuid)).scalar()
            members = list(json.loads(stored)) if stored is not None else []
            members += [m for m in group.members if m not in members]
            values = {"name": group.name, "policy": group.policy,
                      "rules": json.dumps(group.rules, sort_keys=True),
                      "members": json.dumps(members), "project_id": group.project_id,
                      "user_id": group.user_id}
            if stored is None:
                conn.execute(sa.insert(server_groups).values(uuid=group.uuid, **values))
            else:
                conn.execute(sa.update(server_groups).where(server_groups.c.uuid == group.uuid)
                             .values(**values))

    @retried(safe=True)
    def all(self) -> list[InstanceGroup]:
        """Every group, by name then uuid."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(server_groups)
                                .order_by(server_groups.c.name, server_groups.c.uuid)).all()
        return [_group(r) for r in rows]

    @retried(safe=True)
    def of_member(self, instance_uuid: str) -> list[InstanceGroup]:
        """The groups ``instance_uuid`` is a member of (the database narrows the rows by
        the text of their member lists; each is then read exactly)."""
        rows = self._raw.run([(_RAW_WITH_MEMBER, (_containing(instance_uuid),))])[0]
        return [g for g in map(_group, rows) if instance_uuid in g.members]

    @retried(safe=True)
    def get(self, uuid: str) -> InstanceGroup | None:
        """The group ``uuid`` as stored now, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(server_groups).where(server_groups.c.uuid == uuid)).first()
        return None if row is None else _group(row)

    @retried(safe=True)
    def find(self, ref: str) -> list[InstanceGroup]:
        """The group whose uuid is ``ref``, else every group named ``ref`` (by uuid)."""
        rows = self._raw.run([(_RAW_FIND_GROUP, (ref, ref))])[0]
        by_uuid = [r for r in rows if r[0] == ref]
        return [_group(r) for r in (by_uuid or sorted(rows, key=lambda r: str(r[0])))]

    def resolve(self, ref: str, *, field: str = "hints.group") -> InstanceGroup:
        """The group ``ref`` (a uuid or a unique name) with ``hosts``: where its members
        are claimed now. An InputError naming ``field`` when there is no such group or
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
        group.hosts = sorted(set(self.placements.hosts_of(group.members).values()))
        return group

    def add_members(self, uuid: str, members: Iterable[str]) -> None:
        """Add instances to a group's members (each once), atomically."""
        new = list(dict.fromkeys(members))

        def add(current: list[str]) -> list[str]:
            have = set(current)
            return current + [m for m in new if m not in have]

        if new:
            self._edit_members(uuid, add)

    def remove_members(self, uuid: str, members: Iterable[str]) -> None:
        """Remove instances from a group's members, atomically; a group that is gone
        meanwhile has nothing left to remove."""
        gone = set(members)
        if gone:
            self._edit_members(uuid, lambda current: [m for m in current if m not in gone],
                               missing_ok=True)

    @retried(safe=False)
    def admit(self, uuid: str, instance_uuid: str, host: str,
              decide: Callable[[InstanceGroup, dict[str, str]], None]) -> None:
        """The late group check's transaction: under the group's row lock (every
        process's checks of this group take turns), read the group and the hosts its
        other checked-in members are claimed on, let ``decide`` raise to refuse, then
        record ``instance_uuid`` as checked in on ``host`` (its build record). A group
        that is gone has nothing to check. Raw statements on a kept connection: through
        SQLAlchemy, building them cost more than running them."""
        raw = self._raw.take()
        ok = False
        try:
            lock = ((_RAW_GROUP + " FOR UPDATE", "BEGIN") if raw.pg else
                    (_RAW_GROUP, "BEGIN IMMEDIATE"))  # SQLite: the write lock, at once
            row = raw.run([(lock[1], ()), (lock[0], (uuid,))])[1]
            if row:
                group = _group(row[0])
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

    @retried(safe=True)
    def _edit_members(self, uuid: str, edit: Callable[[list[str]], list[str]],
                      missing_ok: bool = False) -> None:
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            stored = conn.execute(_MEMBERS_FOR_UPDATE, {"b_uuid": uuid}).scalar()
            if stored is None:
                if missing_ok:
                    return
                raise InputError(f"server group {uuid}: no such group")
            current = list(json.loads(stored))
            edited = edit(current)
            if edited != current:
                conn.execute(_SET_MEMBERS, {"b_uuid": uuid, "members": json.dumps(edited)})
