"""Credentials of Berth's own HTTP clients.

* A service talking to Placement (``berth compute``) authenticates as Nova's services
  do, with the keystoneauth options of ``[placement]`` in its config files
  (``auth_type = password``, ``auth_url``, ``username``, ...), and reaches it with the
  session options there (``cafile``, ``insecure``, ``certfile``, ``keyfile``,
  ``timeout``): :func:`placement_access`. Without ``[placement] auth_type`` it sends the
  noauth2 token ``admin``.
* A person at the command line (``berth boot``, ``berth server ...``): ``--token``, else
  ``OS_AUTH_TOKEN``, else a token from Keystone with the usual ``OS_AUTH_URL``,
  ``OS_USERNAME``, ``OS_PASSWORD``, ``OS_PROJECT_NAME`` (and domain) variables, else the
  noauth2 token ``admin`` of a development server: :func:`cli_token`.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from berth.errors import ConfigError, InputError, one_line
from berth.placement.transport import DEFAULT_TIMEOUT, SYSTEM_TLS, TLS

#: The token a development (noauth2) server knows as its administrator.
NOAUTH2_ADMIN = "admin"


class KeystoneUnavailable(httpx.TransportError):
    """Keystone gave no token (unreachable, the credentials refused, no endpoint): to
    the caller, Placement cannot be reached now and nothing was sent to it. Nova's report
    client treats these failures alike (``safe_connect``): no candidates, a claim not
    made; a scheduler keeps serving and the next request asks Keystone again."""


class KeystoneAuth(httpx.Auth):
    """Authentication with a keystoneauth plugin: ``X-Auth-Token`` from the plugin
    (cached and renewed by it), fetched again once when the server answers 401 — for
    httpx (``auth_flow``) and as the token source of Berth's kept connections
    (:class:`~berth.placement.transport.TokenSource`)."""

    def __init__(self, plugin: Any, session: Any) -> None:
        self._plugin = plugin
        self._session = session

    def invalidate(self) -> None:
        """The server refused the token: fetch a new one next time."""
        self._plugin.invalidate()

    def token(self) -> str:
        """The token to send (cached and renewed by the plugin)."""
        from keystoneauth1 import exceptions as ks_exc

        try:
            token = self._plugin.get_token(self._session)
        except ks_exc.ClientException as exc:
            raise KeystoneUnavailable(f"[placement] credentials: no token from Keystone: "
                                      f"{one_line(exc)}") from None
        if not token:
            raise KeystoneUnavailable("[placement] credentials: Keystone gave no token")
        return str(token)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["X-Auth-Token"] = self.token()
        response = yield request
        if response.status_code == 401:
            self.invalidate()
            request.headers["X-Auth-Token"] = self.token()
            yield request


@dataclass(frozen=True)
class PlacementAccess:
    """How a service reaches Placement: its credentials (None: the noauth2 token) and
    the options of its HTTP client (:meth:`client_options`)."""

    auth: KeystoneAuth | None
    tls: TLS = SYSTEM_TLS
    timeout: float = DEFAULT_TIMEOUT

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments of :class:`~berth.placement.client.PlacementClient`."""
        return {"auth": self.auth, "tls": self.tls, "timeout": self.timeout}


def session_tls(conf: Any, group: str) -> tuple[TLS, float]:
    """keystoneauth's session options of ``[group]`` (``cafile``, ``insecure``,
    ``certfile``, ``keyfile``, ``timeout``), which Nova's clients use for every call of
    that service, not only for Keystone's: the TLS settings and the timeout (unset:
    Berth's 30 s). A file that does not exist is a ConfigError naming its option."""
    opts = getattr(conf, group)
    for name in ("cafile", "certfile", "keyfile"):
        path = getattr(opts, name)
        if path and not os.path.exists(path):
            raise ConfigError(f"[{group}] {name}: {path}: no such file or directory",
                              field=f"[{group}] {name}")
    verify: bool | str = False if opts.insecure else (opts.cafile or True)
    cert: str | tuple[str, str] | None = None
    if opts.certfile:  # as keystoneauth: a key file only with a certificate
        cert = (opts.certfile, opts.keyfile) if opts.keyfile else opts.certfile
    timeout = float(opts.timeout) if opts.timeout else DEFAULT_TIMEOUT
    return TLS(verify, cert), timeout


def placement_access(config_files: Sequence[str]) -> PlacementAccess:
    """The credentials (keystoneauth options of ``[placement]``; None when
    ``auth_type`` is unset) and the session's TLS options and timeout."""
    from keystoneauth1 import loading
    from oslo_config import cfg

    conf = cfg.ConfigOpts()
    loading.register_auth_conf_options(conf, "placement")
    loading.register_session_conf_options(conf, "placement")
    try:
        conf([], project="berth", default_config_files=list(config_files), use_env=False)
        tls, timeout = session_tls(conf, "placement")
        if not conf.placement.auth_type:
            return PlacementAccess(None, tls, timeout)
        plugin = loading.load_auth_from_conf_options(conf, "placement")
        session = loading.load_session_from_conf_options(conf, "placement", auth=plugin)
    except ConfigError:
        raise
    except (cfg.Error, ValueError) as exc:
        raise ConfigError(f"[placement] {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # keystoneauth's missing-option and unknown-plugin errors
        raise ConfigError(f"[placement] credentials: {str(exc).splitlines()[0]}") from None
    return PlacementAccess(KeystoneAuth(plugin, session), tls, timeout)



def cli_token(given: str | None, environ: Mapping[str, str] | None = None) -> str:
    """The token a command-line client sends (see the module docstring)."""
    env = os.environ if environ is None else environ
    if given:
        return given
    if env.get("OS_AUTH_TOKEN"):
        return env["OS_AUTH_TOKEN"]
    if not env.get("OS_AUTH_URL"):
        return NOAUTH2_ADMIN
    from keystoneauth1 import exceptions as ks_exc
    from keystoneauth1 import session as ks_session
    from keystoneauth1.identity import v3

    missing = [v for v in ("OS_USERNAME", "OS_PASSWORD") if not env.get(v)]
    if missing:
        raise InputError(f"{missing[0]}: not set (OS_AUTH_URL is, so a token is asked of "
                         f"Keystone)")
    plugin = v3.Password(
        auth_url=env["OS_AUTH_URL"], username=env["OS_USERNAME"], password=env["OS_PASSWORD"],
        user_domain_name=env.get("OS_USER_DOMAIN_NAME", "Default"),
        project_name=env.get("OS_PROJECT_NAME"),
        project_domain_name=env.get("OS_PROJECT_DOMAIN_NAME", "Default"))
    try:
        return str(ks_session.Session(auth=plugin).get_token())
    except ks_exc.ClientException as exc:
        raise InputError(f"OS_AUTH_URL: no token from Keystone: {exc}") from None
