"""Bad input to the server commands (``berth scheduler``, ``compute``, ``placement
serve``, ``serve``, ``nova-scheduler``): one line naming the option, exit status 2, and
nothing started or written. Found by a sweep of every server command's options."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from berth.errors import ConfigError
from berth.service.bus import Bus
from berth.service.localcluster import free_port, rabbit_unavailable


def _berth(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "berth.cli", *argv], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _one_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.parametrize(("url", "message"), [
    ("kafka://127.0.0.1:9/", "No module named"),
    ("rabbit://guest:guest@127.0.0.1:abc/", "invalid literal for int()"),
    ("rabbit://guest:guest@[::1/", "Invalid IPv6 URL"),
])
def test_a_transport_url_that_cannot_be_read_is_a_config_error(url: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Bus(url)
    assert "[DEFAULT] transport_url" in str(info.value) and message in str(info.value)
    assert "guest:guest" not in str(info.value)  # the password is masked


@pytest.mark.parametrize(("url", "message"), [
    ("rabbit://guest:wrong@127.0.0.1:5672/", "ACCESS_REFUSED"),
    ("rabbit://guest:guest@127.0.0.1:5672/berth-no-such-vhost", "vhost berth-no-such-vhost not found"),
])
def test_a_broker_that_refuses_a_scheduler_is_one_line(tmp_path: Path, url: str,
                                                        message: str) -> None:
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    done = _berth("scheduler", "--workers", "1", "--db", f"sqlite:///{tmp_path}/db.sqlite",
                  "--transport-url", url)
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert line.startswith("berth scheduler: cannot serve scheduler on") and message in line
    assert "wrong" not in line


@pytest.mark.parametrize(("text", "message"), [
    ("[DEFAULT]\nrpc_response_timeout = abc\n",
     "[DEFAULT] rpc_response_timeout: Value for option rpc_response_timeout in "),
    ("[oslo_messaging_rabbit]\nheartbeat_timeout_threshold = x\n",
     "message bus options: Value for option heartbeat_timeout_threshold in "),
])
def test_a_bad_message_bus_option_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    conf = tmp_path / "nova.conf"
    conf.write_text("[DEFAULT]\ntransport_url = rabbit://guest:guest@127.0.0.1:5672/\n"
                    + text.replace("[DEFAULT]\n", ""))
    done = _berth("scheduler", "--workers", "1", "--db", f"sqlite:///{tmp_path}/db.sqlite",
                  "--config-file", str(conf))
    assert done.returncode == 2
    assert message in _one_line(done.stderr)


def test_a_compute_agent_whose_placement_is_unreachable_is_one_line(tmp_path: Path) -> None:
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    done = _berth("compute", "--host", "x1", "--db", f"sqlite:///{tmp_path}/db.sqlite",
                  "--placement-url", f"http://127.0.0.1:{free_port()}/placement",
                  "--transport-url", "rabbit://guest:guest@127.0.0.1:5672/")
    assert done.returncode == 2
    assert _one_line(done.stderr).startswith("berth compute: cannot start: 127.0.0.1:")


def test_a_compute_agent_whose_placement_authority_file_is_missing_is_one_line(
        tmp_path: Path) -> None:
    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    conf = tmp_path / "compute.conf"
    conf.write_text("[placement]\ncafile = /no/such/ca.pem\n")
    done = _berth("compute", "--host", "x1", "--db", f"sqlite:///{tmp_path}/db.sqlite",
                  "--placement-url", "https://127.0.0.1:1/placement", "--config-file", str(conf),
                  "--transport-url", "rabbit://guest:guest@127.0.0.1:5672/")
    assert done.returncode == 2
    assert _one_line(done.stderr) == ("berth compute: [placement] cafile: /no/such/ca.pem: no "
                                      "such file or directory"), done.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--reconcile-interval", "1e12"], "expected at most 10,000,000 seconds"),
    (["serve", "--build-delay", "1e308"], "expected at most 10,000,000 seconds"),
    (["api", "--threads", "100000"], "expected at most 1024 threads"),
    (["nova-scheduler", "--workers", "0"], "expected a positive integer, got '0'"),
    (["compute", "--host", "a/b c"], "argument --host: expected a host name, got 'a/b c'"),
])
def test_server_options_past_what_works_are_usage_errors(argv: list[str], message: str) -> None:
    done = _berth(*argv)
    assert done.returncode == 2 and message in done.stderr


@pytest.mark.parametrize(("argv", "message"), [
    (["--port", "70000"], "--port must be 0-65535, got 70000"),
    (["--threads", "100000"], "--threads must be at most 1024"),
    (["--workers", "100000"], "--workers must be at most 256"),
    (["--prefix", "noslash"], "--prefix must start with '/'"),
])
def test_placement_serve_options_past_what_works_are_one_line(
        tmp_path: Path, argv: list[str], message: str) -> None:
    done = _berth("placement", "serve", "--auth-strategy", "noauth2", "--db",
                  str(tmp_path / "p.sqlite"), *argv)
    assert done.returncode == 2 and message in _one_line(done.stderr)


@pytest.mark.parametrize("command", [["serve", "--port", "0"], ["placement", "serve"]])
@pytest.mark.parametrize("db", ["", "sqlite://", "sqlite:///:memory:"])
def test_an_in_memory_database_is_refused_in_one_line(command: list[str], db: str) -> None:
    """Every pooled connection would open its own empty database (SQLAlchemy's error
    named its own pool argument)."""
    done = _berth(*command, "--auth-strategy", "noauth2", "--db", db)
    assert done.returncode == 2
    assert "no database file: an in-memory SQLite database is not shared" in _one_line(
        done.stderr)


def test_a_second_placement_prefork_cannot_join_the_first_one_s_port(tmp_path: Path) -> None:
    """SO_REUSEPORT let a second ``--workers 2`` server join the first one's port: the
    requests split between two databases."""
    port = str(free_port())
    first = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "placement", "serve", "--auth-strategy", "noauth2",
         "--db", str(tmp_path / "one.sqlite"), "--port", port, "--workers", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert first.stdout is not None
        deadline = time.monotonic() + 60
        while "listening on" not in first.stdout.readline():
            assert time.monotonic() < deadline and first.poll() is None
        second = _berth("placement", "serve", "--auth-strategy", "noauth2", "--db",
                        str(tmp_path / "two.sqlite"), "--port", port, "--workers", "2")
        assert second.returncode == 2
        assert "cannot listen" in _one_line(second.stderr)
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(timeout=30)


@pytest.mark.parametrize(("text", "option"), [
    ("[oslo_policy]\nenforce_new_defaults = maybe\n", "enforce_new_defaults"),
    ("[api]\nnoauth2_trust_client_roles = maybe\n", "noauth2_trust_client_roles"),
])
def test_an_unreadable_auth_or_policy_value_is_one_line(tmp_path: Path, text: str,
                                                        option: str) -> None:
    conf = tmp_path / "berth.conf"
    conf.write_text(text)
    done = _berth("serve", "--auth-strategy", "noauth2", "--db",
                  f"sqlite:///{tmp_path}/db.sqlite", "--port", str(free_port()),
                  "--config-file", str(conf))
    assert done.returncode == 2
    line = _one_line(done.stderr)
    assert f"Value for option {option} in {conf} is not valid" in line


def test_a_metrics_port_in_use_stops_a_compute_agent_before_it_registers(
        tmp_path: Path) -> None:
    """It registered its hosts first, then failed: they stayed "up" with no agent."""
    import socket

    import sqlalchemy as sa

    reason = rabbit_unavailable()
    if reason:
        pytest.skip(reason)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        db = f"sqlite:///{tmp_path}/db.sqlite"
        done = _berth("compute", "--host", "m1", "--db", db, "--placement-url",
                      f"http://127.0.0.1:{free_port()}/placement", "--transport-url",
                      "rabbit://guest:guest@127.0.0.1:5672/", "--metrics-port", port)
    assert done.returncode == 2
    assert f"--metrics-port {port}: cannot listen" in _one_line(done.stderr)
    engine = sa.create_engine(db)
    try:
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM berth_compute_nodes")).scalar() == 0
    finally:
        engine.dispose()


def test_a_scheduler_stopped_while_its_broker_does_not_answer_takes_its_workers_along(
        tmp_path: Path) -> None:
    """It kept connecting; SIGTERM killed it (status 143) and its worker processes ran on."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "berth.cli", "scheduler", "--workers", "2", "--db",
         f"sqlite:///{tmp_path}/db.sqlite", "--transport-url",
         f"rabbit://guest:guest@127.0.0.1:{free_port()}/"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name = f"-{proc.pid}-1"

    def worker_running() -> bool:
        found = subprocess.run(["pgrep", "-f", "--", name], capture_output=True, text=True)
        return bool(found.stdout.strip())

    try:
        deadline = time.monotonic() + 30
        while not worker_running():
            assert time.monotonic() < deadline, "the worker never started"
            time.sleep(0.2)
        time.sleep(1.0)  # connecting, in vain
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
        deadline = time.monotonic() + 30
        while worker_running():
            assert time.monotonic() < deadline, "the worker outlived its parent"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        subprocess.run(["pkill", "-KILL", "-f", "--", name], check=False)  # never left behind
