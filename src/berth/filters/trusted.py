"""TrustedFilter (removed in Nova 17): place trusted workloads on attested hosts only.

A flavor with the extra spec ``trust:trusted_host`` (``trusted``, ``untrusted``,
``unknown``...) passes only the nodes whose attestation level equals it; other flavors pass
every node (reference §12.6). Attestation levels come from an :class:`AttestationClient`:

* ``[trusted_computing] attestation_server`` set: :class:`HttpAttestationClient`, Nova's
  OpenAttestation protocol (``POST https://server:port<api_url>/PollHosts``) with its
  per-node cache, valid for ``attestation_auth_timeout`` seconds measured against the
  scheduling instant (``host_state.now``), never a clock;
* else ``[trusted_computing] attestation_file`` (Berth): :class:`FileAttestationClient`, a
  YAML or JSON mapping of node name to level; a node it does not name is ``unknown``;
* neither: every node is ``unknown`` (Nova's polls would fail the same way), with a warning.

Lever: the flavor's extra spec, or the attestation source.
"""

from __future__ import annotations

import json
import logging
import ssl
import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import httpx
import numpy as np
import yaml

from berth.errors import ConfigError
from berth.filters.base import BaseHostFilter, Reject

if TYPE_CHECKING:
    from berth.config import SchedulerConfig
    from berth.host_state import Hosts, HostState
    from berth.model.request import RequestSpec

LOG = logging.getLogger(__name__)

EXTRA_SPEC = "trust:trusted_host"
UNKNOWN = "unknown"
#: Statuses after which Nova reads the response body.
_OK_STATUSES = (200, 201, 202, 204)


@runtime_checkable
class AttestationClient(Protocol):
    """Where TrustedFilter gets each node's trust level."""

    def seed(self, nodenames: Iterable[str]) -> None:
        """Make the client aware of every compute node (Nova pre-seeds its cache with them,
        so one poll attests them all)."""
        ...

    def trust_level(self, nodename: str, now: float) -> str:
        """The node's trust level at the scheduling instant ``now`` (epoch seconds)."""
        ...


class StaticAttestationClient:
    """Fixed levels from a mapping; nodes it does not name are ``unknown``."""

    def __init__(self, levels: Mapping[str, str] | None = None) -> None:
        self.levels: dict[str, str] = dict(levels or {})

    def seed(self, nodenames: Iterable[str]) -> None:
        """Nothing to prepare: the levels are fixed."""

    def trust_level(self, nodename: str, now: float) -> str:
        """The mapped level, or ``unknown``."""
        return self.levels.get(nodename, UNKNOWN)


class FileAttestationClient(StaticAttestationClient):
    """Levels read once from a YAML or JSON file mapping node name to trust level.

    A missing, unreadable or malformed file is a :class:`~berth.errors.ConfigError` naming
    the file and the problem, raised at construction (scheduler start-up).
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        super().__init__(self._load(self.path))

    @staticmethod
    def _load(path: Path) -> dict[str, str]:
        where = f"[trusted_computing] attestation_file {path}"
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read it ({exc.strerror or exc})") from exc
        try:
            data = yaml.safe_load(text)  # YAML is a superset of JSON
        except yaml.YAMLError as exc:
            raise ConfigError(f"{where}: not valid YAML or JSON ({exc})") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"{where}: expected a mapping of node name to trust level "
                              f"(trusted, untrusted, unknown), got {type(data).__name__}")
        levels: dict[str, str] = {}
        for node, level in data.items():
            if not isinstance(level, str):
                raise ConfigError(f"{where}: the trust level of node {node!r} must be a string "
                                  f"such as trusted or untrusted, got {level!r}")
            levels[str(node)] = level
        return levels


def parse_vtime(value: Any) -> float | None:
    """An attestation ``vtime`` as epoch seconds: ISO 8601, else ``%c``; naive is UTC.

    None when neither format parses.
    """
    if not isinstance(value, str):
        return None
    parsed: datetime | None = None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        try:
            parsed = datetime.strptime(value, "%c")
        except ValueError:
            return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class HttpAttestationClient:
    """Nova's OpenAttestation client and per-node cache, with httpx.

    Each node has a cache entry ``(trust level, vtime)``; an entry is valid while
    ``now - vtime <= auth_timeout``. Looking up a node whose entry is not valid invalidates
    every entry and re-polls all known nodes with one ``POST .../PollHosts`` whose body is
    ``{"count": n, "hosts": [...]}``; the answer ``{"hosts": [{"host_name", "trust_lvl",
    "vtime"}]}`` refills the cache. A vtime that parses neither as ISO 8601 nor as ``%c``
    makes the node ``unknown`` as of ``now``. A failed poll (network error, bad status, a
    body without a host list) leaves every node ``unknown``, as in Nova.

    TLS: ``ca_file`` verifies the server; ``insecure`` turns verification off. (Nova's
    ``not insecure and ca_file or True`` always verified; Berth honours the option.)
    ``transport`` replaces the network (tests pass an ``httpx.MockTransport``).
    """

    def __init__(
        self,
        server: str,
        *,
        port: int = 8443,
        api_url: str = "/OpenAttestationWebServices/V1.0",
        auth_blob: str | None = None,
        ca_file: str | None = None,
        insecure: bool = False,
        auth_timeout: float = 60,
        transport: httpx.BaseTransport | None = None,
        timeout: float = 30.0,
    ) -> None:
        self.url = f"https://{server}:{port}{api_url}/PollHosts"
        self.auth_timeout = auth_timeout
        self.headers = {"content-type": "application/json", "Accept": "application/json"}
        if auth_blob:
            self.headers["x-auth-blob"] = auth_blob
        verify: ssl.SSLContext | bool
        if insecure:
            verify = False
        else:
            try:
                verify = ssl.create_default_context(cafile=ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ConfigError(
                    f"[trusted_computing] attestation_server_ca_file {ca_file}: cannot load "
                    f"it ({exc})") from exc
        self._client = httpx.Client(verify=verify, transport=transport, timeout=timeout)
        self._cache: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        #: How many polls were sent (for explanations and tests).
        self.polls = 0

    @classmethod
    def from_config(
        cls, config: SchedulerConfig, transport: httpx.BaseTransport | None = None
    ) -> HttpAttestationClient:
        """A client for ``[trusted_computing] attestation_server``."""
        tc = config.trusted_computing
        return cls(
            tc.attestation_server, port=tc.attestation_port, api_url=tc.attestation_api_url,
            auth_blob=tc.attestation_auth_blob, ca_file=tc.attestation_server_ca_file,
            insecure=tc.attestation_insecure_ssl, auth_timeout=tc.attestation_auth_timeout,
            transport=transport,
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._client.close()

    # -- cache ----------------------------------------------------------------------
    def seed(self, nodenames: Iterable[str]) -> None:
        """Add unknown, expired entries for nodes not yet cached."""
        with self._lock:
            for node in nodenames:
                self._cache.setdefault(node, (UNKNOWN, 0.0))

    def trust_level(self, nodename: str, now: float) -> str:
        """The cached level, after a re-poll of every node if this one's entry expired."""
        with self._lock:
            entry = self._cache.setdefault(nodename, (UNKNOWN, 0.0))
            if not now - entry[1] <= self.auth_timeout:
                self._refresh(now)
            return self._cache[nodename][0]

    def _refresh(self, now: float) -> None:
        for node in self._cache:
            self._cache[node] = (UNKNOWN, 0.0)
        states = self.poll(list(self._cache))
        for state in states or []:
            self._store(state, now)

    def _store(self, state: Any, now: float) -> None:
        if not isinstance(state, dict) or not isinstance(state.get("host_name"), str) \
                or "trust_lvl" not in state:
            LOG.warning("attestation server %s: ignoring malformed host entry %r", self.url, state)
            return
        level = str(state["trust_lvl"])
        vtime = parse_vtime(state.get("vtime"))
        if vtime is None:
            # A node whose validation time cannot be read is not trusted, as of now.
            level, vtime = UNKNOWN, now
        self._cache[state["host_name"]] = (level, vtime)

    # -- protocol -------------------------------------------------------------------
    def poll(self, nodenames: Sequence[str]) -> list[Any] | None:
        """POST PollHosts for ``nodenames``; the ``hosts`` list of the answer, or None."""
        self.polls += 1
        body = json.dumps({"count": len(nodenames), "hosts": list(nodenames)})
        try:
            response = self._client.post(self.url, content=body, headers=self.headers)
        except httpx.HTTPError as exc:
            LOG.warning("attestation server %s unreachable: %s", self.url, exc)
            return None
        if response.status_code not in _OK_STATUSES:
            LOG.warning("attestation server %s answered %s", self.url, response.status_code)
            return None
        try:
            data = response.json()
        except ValueError:
            LOG.warning("attestation server %s answered with a body that is not JSON", self.url)
            return None
        hosts = data.get("hosts") if isinstance(data, dict) else None
        if not isinstance(hosts, list):
            LOG.warning("attestation server %s: the answer has no hosts list", self.url)
            return None
        return hosts


def client_from_config(config: SchedulerConfig) -> AttestationClient:
    """The attestation source the options name (server, else file, else all unknown)."""
    tc = config.trusted_computing
    if tc.attestation_server:
        return HttpAttestationClient.from_config(config)
    if tc.attestation_file:
        return FileAttestationClient(tc.attestation_file)
    LOG.warning("TrustedFilter: neither [trusted_computing] attestation_server nor "
                "attestation_file is set; every node is 'unknown'")
    return StaticAttestationClient()


class TrustedFilter(BaseHostFilter):
    """Pass nodes whose attested trust level equals the flavor's trust:trusted_host."""

    run_filter_once_per_request: ClassVar[bool] = True
    RUN_ON_REBUILD: ClassVar[bool] = False

    def __init__(
        self, config: SchedulerConfig | None = None, client: AttestationClient | None = None
    ) -> None:
        super().__init__(config)
        self.client: AttestationClient = client if client is not None else client_from_config(
            self.config)
        self._seeded: tuple[int, int] | None = None

    @staticmethod
    def _requested(spec_obj: RequestSpec) -> str | None:
        trust = (spec_obj.flavor.extra_specs or {}).get(EXTRA_SPEC)
        return trust or None

    def _seed(self, hosts_snapshot: Any) -> None:
        # Nova seeds its cache with every compute node once; Berth on each new snapshot.
        key = (id(hosts_snapshot), hosts_snapshot.generation)
        if self._seeded != key:
            self.client.seed(str(n) for n in hosts_snapshot.obj("nodename"))
            self._seeded = key

    def check(self, host_state: HostState, spec_obj: RequestSpec) -> Reject | None:
        """Reject a node whose trust level differs from the requested one."""
        trust = self._requested(spec_obj)
        if trust is None:
            return None
        self._seed(host_state.working_set.snapshot)
        level = self.client.trust_level(host_state.nodename, host_state.now)
        if level == trust:
            return None
        return Reject.of("untrusted host", requested=trust, level=level)

    def filter_all_hosts(self, hosts: Hosts, spec_obj: RequestSpec) -> np.ndarray:
        """One level lookup per distinct node name (the client polls at most once when its
        cache is stale)."""
        trust = self._requested(spec_obj)
        if trust is None:
            return np.ones(len(hosts), dtype=bool)
        self._seed(hosts.snapshot)
        names = hosts.snapshot.obj("nodename")[hosts.rows]
        now = hosts.ws.now
        levels = {n: self.client.trust_level(n, now) for n in dict.fromkeys(names.tolist())}
        return np.fromiter((levels[n] == trust for n in names.tolist()), dtype=bool,
                           count=len(names))
