"""How a service reaches Placement: ``[placement]``'s credentials and the session
options Nova's clients use for every Placement call (``cafile``, ``insecure``,
``certfile``, ``keyfile``, ``timeout``), for ``berth compute`` and ``berth
nova-scheduler``."""

from __future__ import annotations

from pathlib import Path

import pytest

from berth.errors import ConfigError
from berth.nova.command import placement_endpoint
from berth.placement.client import PlacementClient
from berth.placement.transport import TLS
from berth.service.placement import PlacementCandidates
from berth.webauth.client import DEFAULT_TIMEOUT, placement_access

from .test_transport import _tls_server


def _conf(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nova.conf"
    path.write_text(text)
    return str(path)


def test_the_session_options_of_placement_are_read(tmp_path: Path) -> None:
    ca, cert, key = (tmp_path / name for name in ("ca.pem", "cert.pem", "key.pem"))
    for path in (ca, cert, key):
        path.write_text("")
    access = placement_access([_conf(tmp_path, f"[placement]\ncafile = {ca}\ncertfile = {cert}\n"
                                               f"keyfile = {key}\ntimeout = 7\n")])
    assert access.auth is None
    assert (access.tls, access.timeout) == (TLS(str(ca), (str(cert), str(key))), 7.0)
    access = placement_access([_conf(tmp_path, f"[placement]\ninsecure = true\ncafile = {ca}\n"
                                               f"certfile = {cert}\n")])
    assert (access.tls, access.timeout) == (TLS(False, str(cert)), DEFAULT_TIMEOUT)
    assert placement_access([_conf(tmp_path, "[placement]\n")]).tls == TLS()


@pytest.mark.parametrize("option", ["cafile", "certfile", "keyfile"])
def test_a_missing_file_is_one_line_naming_its_option(tmp_path: Path, option: str) -> None:
    files = [_conf(tmp_path, f"[placement]\nendpoint_override = https://p\n{option} = /no/such.pem\n")]
    for read in (placement_access, placement_endpoint):
        with pytest.raises(ConfigError, match=rf"^\[placement\] {option}: /no/such.pem: no such "
                                              "file or directory$"):
            read(files)


def test_nova_s_scheduler_queries_an_https_placement_with_its_cafile(tmp_path: Path) -> None:
    """A Placement behind TLS with a private authority, as nova.conf names it: the
    query reaches it (it used to fail verification, and every boot with it)."""
    srv, thread, cert = _tls_server(tmp_path / "tls")
    url = f"https://127.0.0.1:{srv.server_address[1]}/placement"
    try:
        for extra in ("", f"cafile = {cert}\n"):
            files = [_conf(tmp_path, f"[placement]\nendpoint_override = {url}\n{extra}")]
            endpoint, access = placement_endpoint(files)
            with PlacementClient(endpoint, microversion="1.36", **access.client_options()) as client:
                answer = PlacementCandidates(client).get([("resources", "VCPU:1")])
            if extra:
                assert answer.error is None
            else:  # the system's authorities do not know it
                assert answer.error is not None and "certificate" in answer.error
    finally:
        srv.shutdown()
        thread.join(timeout=5)
