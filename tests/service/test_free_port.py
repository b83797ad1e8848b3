"""The ports the test servers and the local cluster are started on."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

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


def test_a_range_that_starts_low_gives_ports_above_it_or_the_kernels(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tuned ``ip_local_port_range`` of 1024-50000 leaves nothing below it: ports come
    from above it; a range of 1024-65535 leaves the choice to the kernel."""
    import berth.service.localcluster as localcluster

    fake = tmp_path / "ip_local_port_range"
    monkeypatch.setattr(localcluster, "_EPHEMERAL", fake)
    fake.write_text("1024\t50000\n")
    assert all(50000 < free_port() <= 65535 for _ in range(20))
    fake.write_text("1024\t65535\n")
    assert 0 < free_port() <= 65535
    fake.write_text("garbage\n")
    assert 0 < free_port() <= 65535


def test_processes_calling_at_once_draw_from_different_shares() -> None:
    """Two test workers each check a port and then start a server on it; were they to
    draw from the same ports, one could check the port the other has checked but not
    bound yet. Each process holds its own share of the range while it runs."""
    import subprocess
    import sys

    import berth.service.localcluster as localcluster

    free_port()
    assert localcluster._held is not None
    mine = localcluster._held[1]
    script = ("import berth.service.localcluster as l\n"
              "ports = [l.free_port() for _ in range(20)]\n"
              "print(l._held[1], min(ports), max(ports))\n")
    other, low, high = (int(v) for v in subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True,
        timeout=60).stdout.split())
    assert other != mine
    first = max(1024, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text()
                          .split()[0]) - 10000)
    size = 10000 // localcluster._SHARES
    assert first + other * size <= low <= high < first + (other + 1) * size
