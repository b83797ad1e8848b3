"""Where each instance is reported: instance uuid -> snapshot row, kept up to date
report by report (:meth:`berth.snapshot.HostSnapshot.instance_rows`).

Building the map walks every instance of the cloud (~1 ms at 30,000), and a request of a
server group needs it after any report. An :class:`InstanceIndex` is instead a *base*
map built once plus an *overlay* of what the reports since changed; an update copies the
overlay only (a copy of a 30,000-entry dict that has had deletions takes ~0.7 ms:
CPython re-inserts every entry), and a new base is built once the overlay has grown to a
quarter of the base (or half of its rows). An index handed out never changes, so a
reader keeps a consistent view.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Protocol

_GONE = -1  # in the overlay: the base's entry no longer holds


class Rows(Protocol):
    """Each row's instances (uuid -> instance): the snapshot's ``instances`` column."""

    def __getitem__(self, row: int, /) -> Any: ...

    def __iter__(self) -> Iterator[Any]: ...


class InstanceIndex(Mapping[str, int]):
    """Instance uuid -> row of the node that reports it. An instance two nodes report (a
    migration's moment) goes to the later row, as a walk of the rows gives; while one
    exists (``dups``), every update builds the index again."""

    __slots__ = ("_base", "_over", "_held", "_held_over", "dups")

    def __init__(self, base: dict[str, int], over: dict[str, int],
                 held: list[tuple[str, ...]], held_over: dict[int, tuple[str, ...]],
                 dups: bool) -> None:
        self._base = base
        self._over = over
        #: What each row put in when the base was built, and since (by row).
        self._held = held
        self._held_over = held_over
        self.dups = dups

    @classmethod
    def build(cls, instances: Rows) -> InstanceIndex:
        """The index of each row's instances (``instances[row]``: uuid -> instance)."""
        base: dict[str, int] = {}
        held: list[tuple[str, ...]] = []
        dups = False
        for row, on_row in enumerate(instances):
            uuids = tuple(on_row)
            held.append(uuids)
            for uuid in uuids:
                dups = dups or uuid in base
                base[uuid] = row
        return cls(base, {}, held, {}, dups)

    def updated(self, instances: Rows, rows: Iterable[int]) -> InstanceIndex:
        """A new index after ``rows`` reported again (``instances`` as for :meth:`build`,
        with the same rows); this one is left as it was."""
        if self.dups:
            return InstanceIndex.build(instances)
        base, held = self._base, self._held
        over, held_over = dict(self._over), dict(self._held_over)
        # Each row's difference, by sets: a report usually adds or removes one instance
        # of the many its row holds.
        changes: list[tuple[int, set[str], set[str]]] = []
        for row in set(rows):
            before = held_over.get(row, held[row] if row < len(held) else ())
            now = tuple(instances[row])
            if now != before:
                held_over[row] = now
                was, is_ = set(before), set(now)
                changes.append((row, was - is_, is_ - was))
        for row, gone, _ in changes:
            for uuid in gone:
                if _row_in(base, over, uuid) == row:
                    if uuid in base:
                        over[uuid] = _GONE
                    else:
                        del over[uuid]
        for row, _, came in changes:
            for uuid in came:
                at = _row_in(base, over, uuid)
                if at is not None and at != row:
                    return InstanceIndex.build(instances)  # a second node reports it
                if base.get(uuid) == row:
                    over.pop(uuid, None)
                else:
                    over[uuid] = row
        if len(over) > max(256, len(base) // 4) or len(held_over) > max(64, len(held) // 2):
            return InstanceIndex.build(instances)
        return InstanceIndex(base, over, held, held_over, False)

    # Mapping
    def get(self, key: str, default: Any = None) -> Any:  # type: ignore[override]
        row = self._over.get(key)
        if row is None:
            return self._base.get(key, default)
        return default if row == _GONE else row

    def __getitem__(self, key: str) -> int:
        row = self.get(key)
        if row is None:
            raise KeyError(key)
        return int(row)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None

    def __iter__(self) -> Iterator[str]:
        over = self._over
        yield from (uuid for uuid in self._base if uuid not in over)
        yield from (uuid for uuid, row in over.items() if row != _GONE)

    def __len__(self) -> int:
        over = self._over
        return (sum(1 for uuid in self._base if uuid not in over)
                + sum(1 for row in over.values() if row != _GONE))


def _row_in(base: dict[str, int], over: dict[str, int], uuid: str) -> int | None:
    row = over.get(uuid)
    if row is None:
        return base.get(uuid)
    return None if row == _GONE else row
