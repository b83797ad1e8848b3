"""Who is calling: the two ways an HTTP API of Berth learns its caller
(``[api] auth_strategy``, as in nova.conf and placement.conf).

* **keystone** (Nova's and Placement's default): keystonemiddleware's ``auth_token``
  validates ``X-Auth-Token`` against Keystone with the service credentials of
  ``[keystone_authtoken]``. It runs with ``delay_auth_decision`` so that the API itself
  answers 401 where a route needs a caller (after CORS preflights, and never on the
  unauthenticated routes such as Placement's ``/``). Before anything else the middleware
  removes every identity header the client sent (``X-Roles``, ``X-Project-Id``, ...): the
  caller is only what Keystone confirmed.
* **noauth2**, for development and tests, never the default: the token is
  ``user[:project]`` (the project is the user when omitted); the user ``admin`` has the
  role ``admin``, any other user none. What a client says about itself in headers
  (``X-Roles``, ``X-Project-Id``/``X-Tenant-Id``, ``OpenStack-System-Scope: all``) is
  ignored unless the server was told in so many words to trust it
  (``[api] noauth2_trust_client_roles = true``, ``--noauth2-trust-client-roles``), which
  is what Placement's own functional tests rely on.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from berth.errors import ConfigError

WsgiApp = Callable[..., Any]
LOG = logging.getLogger(__name__)


@dataclass
class Caller:
    """The caller as policy sees it: user, project, roles and scope."""

    user_id: str
    project_id: str | None
    roles: list[str] = field(default_factory=list)
    system_scope: bool = False

    def creds(self) -> dict[str, Any]:
        """The credentials oslo.policy checks (a system-scoped token has no project)."""
        return {"user_id": self.user_id, "project_id": self.project_id,
                "roles": list(self.roles), "system_scope": "all" if self.system_scope else None}


class Identity(Protocol):
    """How an API learns its caller."""

    @property
    def strategy(self) -> str:
        """``keystone`` or ``noauth2``."""

    @property
    def challenge(self) -> str:
        """The ``WWW-Authenticate`` value of a 401 ("" when the middleware adds its own)."""

    def wrap(self, app: WsgiApp) -> WsgiApp:
        """The app behind whatever middleware this strategy needs (once per server)."""

    def caller(self, environ: dict[str, Any]) -> Caller | None:
        """The authenticated caller of a request, or None (a 401 where one is needed)."""


def _header(environ: dict[str, Any], name: str) -> str | None:
    return environ.get("HTTP_" + name.upper().replace("-", "_"))


def _roles(value: str | None) -> list[str]:
    return [r.strip() for r in (value or "").split(",") if r.strip()]


@dataclass(frozen=True)
class NoAuth2:
    """Development authentication: the token names the user and project."""

    trust_client_roles: bool = False
    strategy: str = "noauth2"
    challenge: str = "Keystone uri='noauth'"

    def wrap(self, app: WsgiApp) -> WsgiApp:
        return app

    def caller(self, environ: dict[str, Any]) -> Caller | None:
        token = _header(environ, "X-Auth-Token")
        if token is None:
            return None
        user, _, project = token.partition(":")
        if not user:
            return None
        roles = ["admin"] if user == "admin" else []
        project_id: str | None = project or user
        system = False
        if self.trust_client_roles:
            claimed = _header(environ, "X-Roles")
            if claimed is not None:
                roles = _roles(claimed)
            project_id = (_header(environ, "X-Project-Id") or _header(environ, "X-Tenant-Id")
                          or project_id)
            system = (_header(environ, "OpenStack-System-Scope") or "").lower() == "all"
            if system:
                project_id = None
        return Caller(user_id=user, project_id=project_id, roles=roles, system_scope=system)


class Keystone:
    """Keystone tokens, validated by keystonemiddleware with ``[keystone_authtoken]``."""

    strategy = "keystone"

    def __init__(self, conf: Any) -> None:
        """``conf``: the oslo.config ConfigOpts read from the service's config files."""
        with warnings.catch_warnings():
            # keystonemiddleware's cache layer imports eventlet, which warns on import.
            warnings.simplefilter("ignore")
            from keystonemiddleware import auth_token

        self._auth_token = auth_token
        self._conf = conf
        # Registering the options here lets a missing one be reported at start-up.
        auth_token.AuthProtocol(lambda environ, start: [], self._local_conf())
        group = conf.keystone_authtoken
        if not group.auth_type:
            raise ConfigError(
                "[keystone_authtoken] auth_type: not set; [api] auth_strategy = keystone "
                "needs the credentials that validate tokens (auth_type = password, auth_url, "
                "username, password, project_name, user_domain_name, project_domain_name)")
        if not group.www_authenticate_uri:
            raise ConfigError("[keystone_authtoken] www_authenticate_uri: not set (the "
                              "Keystone address a 401 sends clients to)")
        #: keystonemiddleware adds ``WWW-Authenticate: Keystone uri="..."`` to every 401.
        self.challenge = ""

    def _local_conf(self) -> dict[str, Any]:
        return {"oslo_config_config": self._conf, "delay_auth_decision": True}

    def wrap(self, app: WsgiApp) -> WsgiApp:
        protocol = self._auth_token.AuthProtocol(app, self._local_conf())

        def guarded(environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
            # keystonemiddleware answers an unreachable Keystone with a 503 itself; what
            # it lets escape (a catalog without the identity endpoint it looks for, say)
            # is a token that cannot be validated now, not a server fault.
            try:
                return protocol(environ, start_response)
            except Exception as exc:
                LOG.exception("cannot validate the token of %s %s",
                              environ.get("REQUEST_METHOD"), environ.get("PATH_INFO"))
                body = json.dumps({"error": {
                    "code": "berth.unavailable.keystone",
                    "message": f"cannot validate tokens with Keystone now: {exc}"}}).encode()
                start_response("503 Service Unavailable", [
                    ("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                    ("Retry-After", "5")])
                return [body]

        return guarded

    def caller(self, environ: dict[str, Any]) -> Caller | None:
        if environ.get("HTTP_X_IDENTITY_STATUS") != "Confirmed":
            return None
        user = environ.get("HTTP_X_USER_ID")
        if not user:
            return None
        system = (_header(environ, "OpenStack-System-Scope") or "").lower() == "all"
        project = None if system else environ.get("HTTP_X_PROJECT_ID")
        return Caller(user_id=user, project_id=project, roles=_roles(environ.get("HTTP_X_ROLES")),
                      system_scope=system)
