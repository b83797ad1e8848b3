"""Server groups of ``berth serve``: stored in the shared database, resolved for a boot.

Nova keeps server groups in its API database: the API resolves the ``group`` scheduler
hint to the group and adds the new instances to its members, and the conductor fills in
the hosts the members run on (``setup_instance_group``) before the scheduler's
affinity filters read them. Berth stores a group's uuid, name, policy, rules and
members in table ``berth_server_groups`` (created with ``create_all``, beside the
compute records) and derives ``hosts`` at every request from where the members run
now, as the hosts last reported them (:func:`member_hosts`).

Groups come from a cloud file's ``server_groups`` (``berth serve --cloud``). A boot into
a group adds its instances to the members before they are scheduled, as Nova's API
does, so a concurrent boot's late check counts them once they run
(:meth:`ServerGroupStore.add_members`); the instances that end up not built leave the
group again (:meth:`ServerGroupStore.remove_members`). Nova keeps a failed instance as a
member until the instance is deleted; Berth keeps no instance that was not built.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from berth.errors import InputError
from berth.model.request import InstanceGroup
from berth.placement.db import create_tables
from berth.snapshot import HostSnapshot

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


def _group(row: Any) -> InstanceGroup:
    return InstanceGroup(policy=row.policy, uuid=row.uuid, name=row.name,
                         rules=json.loads(row.rules), members=list(json.loads(row.members)),
                         project_id=row.project_id, user_id=row.user_id)


def member_hosts(snapshot: HostSnapshot, members: Iterable[str]) -> list[str]:
    """The hosts (sorted, each once) whose reported instances include a member, looked
    up in the snapshot's instance index (built once per snapshot change)."""
    rows = snapshot.instance_rows()
    hosts = snapshot.obj("host")
    return sorted({hosts[rows[m]] for m in members if m in rows})


class ServerGroupStore:
    """Server groups in SQL; a boot's instances join before it is scheduled and those
    not built leave after it (a multi-create adds several)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        create_tables(engine, groups_metadata)

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

    def all(self) -> list[InstanceGroup]:
        """Every group, by name then uuid."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(server_groups)
                                .order_by(server_groups.c.name, server_groups.c.uuid)).all()
        return [_group(r) for r in rows]

    def get(self, uuid: str) -> InstanceGroup | None:
        """The group ``uuid`` as stored now, or None."""
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(server_groups).where(server_groups.c.uuid == uuid)).first()
        return None if row is None else _group(row)

    def find(self, ref: str) -> list[InstanceGroup]:
        """The group whose uuid is ``ref``, else every group named ``ref``."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa.select(server_groups).where(server_groups.c.uuid == ref)).all()
            if not rows:
                rows = conn.execute(sa.select(server_groups).where(server_groups.c.name == ref)
                                    .order_by(server_groups.c.uuid)).all()
        return [_group(r) for r in rows]

    def resolve(self, ref: str, snapshot: HostSnapshot, field: str = "hints.group") -> InstanceGroup:
        """The group ``ref`` (a uuid or a unique name) with ``hosts`` read from
        ``snapshot``; an InputError naming ``field`` when there is no such group or the
        name is ambiguous."""
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
        group.hosts = member_hosts(snapshot, group.members)
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

    def _edit_members(self, uuid: str, edit: Callable[[list[str]], list[str]],
                      missing_ok: bool = False) -> None:
        with self.engine.connect().execution_options(immediate=True) as conn, conn.begin():
            stored = conn.execute(sa.select(server_groups.c.members)
                                  .where(server_groups.c.uuid == uuid).with_for_update()).scalar()
            if stored is None:
                if missing_ok:
                    return
                raise InputError(f"server group {uuid}: no such group")
            current = list(json.loads(stored))
            edited = edit(current)
            if edited != current:
                conn.execute(sa.update(server_groups).where(server_groups.c.uuid == uuid)
                             .values(members=json.dumps(edited)))
