"""Compute nodes grouped by service host, and the instances each service host runs.

Nova keeps a host's instances per *service host*: ``HostManager._get_instance_info``
looks them up by ``compute.host``, and every node of that host (Ironic-style, several
``hypervisor_hostname`` under one nova-compute) gets the same dict as
``HostState.instances`` — including the stub instance the scheduler adds after a pick
(reference §2.1, §8.2 step 8, §10.2). Everything else a node reports stays per node:
usage, ``stats`` and with it ``num_instances`` (NumInstancesFilter, NumInstancesWeigher),
``num_io_ops``, NUMA and PCI.

A snapshot row still records the instances *its* node reported (where they consume
resources); :class:`ServiceHosts` is the per-snapshot index that merges them per service
host, so filters, weighers and explanations read the host's set on every node of it.
The request's stubs live in :class:`berth.host_state.WorkingSet`, shared by the nodes of
a host as Nova shares them while it tracks instance changes (``[filter_scheduler]
track_instance_changes``, the default); without tracking Nova hands each node its own
copy read from the database, and a stub stays on the node it was placed on.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from berth.model.compute import Instance


class ServiceHosts:
    """Which snapshot rows share a service host, and the instances of each service host.

    ``codes[row]`` numbers the row's service host (0, 1, ... in order of first row), so
    rows of one host share a code. :meth:`instances` of a row is the host's instance
    dict: the row's own dict when the host has one node, else the merge of its nodes'
    dicts in row order (one dict shared by those rows, built on first use). Built once
    per snapshot structure (:meth:`berth.snapshot.HostSnapshot.service_hosts`) with
    C-level passes only; never modify what it returns.
    """

    __slots__ = ("codes", "_own", "_multi", "_order", "_starts", "_counts", "_merged",
                 "_column")

    def __init__(self, hosts: Sequence[str], instances: np.ndarray) -> None:
        n = len(hosts)
        self._own = instances
        self._merged: dict[int, dict[str, Instance]] = {}
        self._column: np.ndarray | None = None
        if len(set(hosts)) == n:
            # One node per service host (the common case): the code is the row itself.
            self.codes = np.arange(n, dtype=np.int64)
            self._multi = False
            return
        ids = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
        self.codes = np.fromiter(map(ids.__getitem__, hosts), dtype=np.int64, count=n)
        self._multi = True
        # Rows grouped by code (stable: row order within a host), and where each starts.
        self._order = np.argsort(self.codes, kind="stable")
        self._counts = np.bincount(self.codes, minlength=len(ids))
        self._starts = np.concatenate(([0], np.cumsum(self._counts)[:-1]))

    @property
    def multi_node(self) -> bool:
        """True when some service host has more than one node."""
        return self._multi

    def code_of(self, row: int) -> int:
        """The service-host code of ``row``."""
        return int(self.codes[row])

    def codes_of(self, rows: np.ndarray) -> np.ndarray:
        """The service-host codes of ``rows`` (``rows`` itself when every host has one
        node; do not write to the result)."""
        return self.codes[rows] if self._multi else rows

    def rows_of(self, code: int) -> tuple[int, ...]:
        """Every row (node) of the service host ``code``, in row order."""
        if not self._multi:
            return (code,)
        start = int(self._starts[code])
        return tuple(self._order[start:start + int(self._counts[code])].tolist())

    def first_row(self, code: int) -> int:
        """One row of the service host ``code`` (its first)."""
        return int(self._order[self._starts[code]]) if self._multi else code

    def instances(self, row: int) -> dict[str, Instance]:
        """The instances of the service host of ``row``, as its nodes reported them."""
        if not self._multi:
            return self._own[row]  # type: ignore[no-any-return]
        code = int(self.codes[row])
        if self._counts[code] == 1:
            return self._own[row]  # type: ignore[no-any-return]
        merged = self._merged.get(code)
        if merged is None:
            merged = {}
            for sibling in self.rows_of(code):
                merged.update(self._own[sibling])
            self._merged[code] = merged
        return merged

    def instances_column(self) -> np.ndarray:
        """:meth:`instances` of every row, as an object array (for bulk plugins that
        derive a per-row value from each host's instances; do not modify)."""
        if not self._multi:
            return self._own
        if self._column is None:
            column = self._own.copy()
            for code in np.flatnonzero(self._counts > 1).tolist():
                merged = self.instances(self.first_row(code))
                for row in self.rows_of(code):
                    column[row] = merged
            self._column = column
        return self._column
