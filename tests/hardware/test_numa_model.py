"""The host NUMA model and its cloud-file dict form."""

from __future__ import annotations

from typing import Any

import pytest

from berth.hardware.numa import NUMATopology

TWO_CELLS: dict[str, Any] = {"cells": [
    {"id": 0, "cpuset": "0-3", "pcpuset": [4, 5, 6, 7], "siblings": [[4, 6], [5, 7]],
     "memory": 65536, "cpu_usage": 1, "memory_usage": 1024, "pinned_cpus": "4", "socket": 0,
     "mempages": [{"size_kb": 4, "total": 16777216}, {"size_kb": 2048, "total": 1024, "used": 2,
                                                       "reserved": 1}],
     "network_metadata": {"physnets": ["physnet0"], "tunneled": True}},
    {"id": 1, "memory": 1024},
]}


def test_dict_form_round_trips() -> None:
    topo = NUMATopology.from_dict(TWO_CELLS)
    again = NUMATopology.from_dict(topo.to_dict())
    assert again == topo and hash(again) == hash(topo)
    c0 = topo.cells[0]
    assert c0.cpuset == {0, 1, 2, 3} and c0.pcpuset == {4, 5, 6, 7}
    assert c0.free_pcpus == {5, 6, 7} and c0.avail_memory == 64512 and c0.avail_cpus == 3
    assert c0.mempages[1].free == 1021
    assert c0.network_metadata is not None and c0.network_metadata.tunneled


def test_has_threads_needs_a_sibling_set_larger_than_one() -> None:
    assert NUMATopology.from_dict(TWO_CELLS).has_threads
    flat = NUMATopology.from_dict({"cells": [{"id": 0, "pcpuset": "0-3", "siblings": [[0], [1]],
                                              "memory": 1}]})
    assert not flat.has_threads


def test_a_topology_without_cells_is_falsy() -> None:
    assert not NUMATopology.from_dict({"cells": []})


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"cells": [{"memory": 1}]}, "cells[0].id"),
        ({"cells": [{"id": 0}]}, "cells[0].memory"),
        ({"cells": [{"id": 0, "memory": -1}]}, "cells[0].memory"),
        ({"cells": [{"id": 0, "memory": "lots"}]}, "cells[0].memory"),
        ({"cells": [{"id": 0, "memory": 1, "cpuset": "0-x"}]}, "cells[0].cpuset"),
        ({"cells": [{"id": 0, "memory": 1, "pinned_cpus": [3]}]}, "cells[0].pinned_cpus"),
        ({"cells": [{"id": 0, "memory": 1, "mempages": [{"size_kb": 0, "total": 1}]}]},
         "cells[0].mempages[0].size_kb"),
        ({"cells": [{"id": 0, "memory": 1, "siblings": [["a"]]}]}, "cells[0].siblings[0]"),
        ({"cells": [{"id": 0, "memory": 1, "cores": 4}]}, "cells[0]"),
        ({"cells": [{"id": 0, "memory": 1}, {"id": 0, "memory": 1}]}, "cells"),
        ({"cells": "0-3"}, "cells"),
        ({"cells": [{"id": 0, "memory": 1, "network_metadata": {"tunneled": "yes"}}]},
         "cells[0].network_metadata.tunneled"),
    ],
    ids=["a cell without id", "a cell without memory", "negative memory", "memory that is not a number",
         "a bad CPU spec", "pinned CPUs outside pcpuset", "a zero page size",
         "a sibling that is not a CPU", "an unknown cell key", "duplicate cell ids",
         "cells that are not a list", "tunneled that is not a boolean"],
)
def test_bad_dicts_name_the_field(data: dict[str, Any], field: str) -> None:
    with pytest.raises((TypeError, ValueError)) as err:
        NUMATopology.from_dict(data)
    assert str(err.value).startswith(field)
