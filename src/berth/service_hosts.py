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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from berth.model.compute import Instance


class ServiceHosts:
    """Which snapshot rows share a service host, and each row's service-host instances.

    ``codes[row]`` numbers the row's service host (0, 1, ... in order of first row), so
    rows of one host share a code. ``instances[row]`` is the host's instance dict: the
    row's own dict when the host has one node, else the merge of its nodes' dicts in row
    order (one dict object shared by those rows). Built once per snapshot structure
    (:meth:`berth.snapshot.HostSnapshot.service_hosts`); never modify what it returns.
    """

    __slots__ = ("codes", "instances", "_first_row", "_siblings")

    def __init__(self, hosts: Sequence[str], instances: np.ndarray) -> None:
        n = len(hosts)
        self._siblings: dict[int, tuple[int, ...]] = {}
        if len(set(hosts)) == n:
            # One node per service host (the common case): the code is the row itself.
            self.codes = np.arange(n, dtype=np.int64)
            self._first_row: np.ndarray | None = None
            self.instances = instances
            return
        ids: dict[str, int] = {}
        codes = [ids.setdefault(h, len(ids)) for h in hosts]
        self.codes = np.asarray(codes, dtype=np.int64)
        groups: dict[int, list[int]] = {}
        for row, code in enumerate(codes):
            groups.setdefault(code, []).append(row)
        self._first_row = np.fromiter((rows[0] for rows in groups.values()), dtype=np.int64,
                                      count=len(groups))
        merged = np.array(instances, dtype=object, copy=True)
        for code, rows in groups.items():
            if len(rows) == 1:
                continue
            self._siblings[code] = tuple(rows)
            together: dict[str, Instance] = {}
            for row in rows:
                together.update(instances[row])
            for row in rows:
                merged[row] = together
        self.instances = merged

    @property
    def multi_node(self) -> bool:
        """True when some service host has more than one node."""
        return bool(self._siblings)

    def code_of(self, row: int) -> int:
        """The service-host code of ``row``."""
        return int(self.codes[row])

    def codes_of(self, rows: np.ndarray) -> np.ndarray:
        """The service-host codes of ``rows`` (``rows`` itself when every host has one
        node; do not write to the result)."""
        return self.codes[rows] if self._siblings else rows

    def rows_of(self, code: int) -> tuple[int, ...]:
        """Every row (node) of the service host ``code``, in row order."""
        siblings = self._siblings.get(code)
        if siblings is not None:
            return siblings
        return (code,) if self._first_row is None else (int(self._first_row[code]),)

    def first_row(self, code: int) -> int:
        """One row of the service host ``code`` (its first)."""
        return code if self._first_row is None else int(self._first_row[code])
