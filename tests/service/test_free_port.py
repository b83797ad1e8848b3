"""The ports the test servers and the local cluster are started on."""

from __future__ import annotations

import socket
from pathlib import Path

from berth.service.localcluster import free_port


def test_free_ports_come_from_below_the_ephemeral_range_and_never_twice() -> None:
    """Outgoing connections take their local ports from the ephemeral range; a port from
    there could be taken between the check and the server's bind."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    assert all(max(1024, low - 10000) <= p < low for p in ports)
    with socket.socket() as s:  # and nothing listens there
        s.bind(("127.0.0.1", ports[-1]))
