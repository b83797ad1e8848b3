"""Credentials of Berth's own HTTP clients.

* A service talking to Placement (``berth compute``) authenticates as Nova's services
  do, with the keystoneauth options of ``[placement]`` in its config files
  (``auth_type = password``, ``auth_url``, ``username``, ...): :func:`placement_auth`.
  Without ``[placement] auth_type`` it sends the noauth2 token ``admin``.
* A person at the command line (``berth boot``, ``berth server ...``): ``--token``, else
  ``OS_AUTH_TOKEN``, else a token from Keystone with the usual ``OS_AUTH_URL``,
  ``OS_USERNAME``, ``OS_PASSWORD``, ``OS_PROJECT_NAME`` (and domain) variables, else the
  noauth2 token ``admin`` of a development server: :func:`cli_token`.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Mapping, Sequence
from typing import Any

import httpx

from berth.errors import ConfigError, InputError

#: The token a development (noauth2) server knows as its administrator.
NOAUTH2_ADMIN = "admin"


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
            raise ConfigError(f"[placement] credentials: Keystone refused them: {exc}") from None
        if not token:
            raise ConfigError("[placement] credentials: Keystone gave no token")
        return str(token)

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        request.headers["X-Auth-Token"] = self.token()
        response = yield request
        if response.status_code == 401:
            self.invalidate()
            request.headers["X-Auth-Token"] = self.token()
            yield request


def placement_auth(config_files: Sequence[str]) -> KeystoneAuth | None:
    """The keystoneauth credentials of ``[placement]``, or None when none are set."""
    from keystoneauth1 import loading
    from oslo_config import cfg

    conf = cfg.ConfigOpts()
    loading.register_auth_conf_options(conf, "placement")
    loading.register_session_conf_options(conf, "placement")
    try:
        conf([], project="berth", default_config_files=list(config_files), use_env=False)
        if not conf.placement.auth_type:
            return None
        plugin = loading.load_auth_from_conf_options(conf, "placement")
        session = loading.load_session_from_conf_options(conf, "placement", auth=plugin)
    except (cfg.Error, ValueError) as exc:
        raise ConfigError(f"[placement] {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # keystoneauth's missing-option and unknown-plugin errors
        raise ConfigError(f"[placement] credentials: {str(exc).splitlines()[0]}") from None
    return KeystoneAuth(plugin, session)


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
