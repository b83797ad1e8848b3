"""The Placement WSGI application: the route table and the request pipeline.

Pipeline, outermost first (reference 1.1):

1. request id; a missing or ``*/*`` Accept becomes ``application/json``;
2. CORS preflight, when configured;
3. authentication (:mod:`berth.webauth.identity`: Keystone, or noauth2 for
   development): no caller outside ``/`` (and, under Keystone, the empty path) is a 401
   in WebOb's plain JSON;
4. the caller (user, project, roles, scope) becomes the request's context;
5. fault wrapper: anything unexpected is a JSON 500; an unavailable database (a lost
   connection, a lock timeout) is retried where safe, else a 503 with Retry-After
   (:mod:`berth.placement.dbfaults`);
6. microversion header (400 / 406 without ``code``);
7. Content-Length / Content-Type sanity, routing (404, 405 + ``allow``), then the
   endpoint's own checks (microversion 404, Accept 406, media type 415, policy 403:
   oslo.policy with Placement's rules, :mod:`berth.placement.policy`) and the handler.
"""

from __future__ import annotations

import json
import logging
import uuid as uuid_mod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import exc as sa_exc

from berth.errors import ServiceUnavailable as BerthUnavailable
from berth.placement import errors, handlers, policy
from berth.placement.dbfaults import call_with_retry
from berth.placement.handlers import Endpoint, always
from berth.placement.microversion import (
    MAX_VERSION,
    MIN_VERSION,
    InvalidVersion,
    UnacceptableVersion,
    extract_version,
)
from berth.placement.store import PlacementStore
from berth.placement.web import (
    EXPLANATIONS,
    JSON_TYPE,
    Request,
    Response,
    accepts_json,
    empty_response,
    render_error,
)
from berth.webauth.identity import Caller, NoAuth2
from berth.webauth.rules import PolicyEnforcer, PolicyMode
from berth.webauth.settings import Security

LOG = logging.getLogger(__name__)

_P = "placement:"
_RP = _P + "resource_providers:"
_INV = _RP + "inventories:"
_RC = _P + "resource_classes:"


def _body_below_1_7(version: tuple[int, int]) -> bool:
    return version < (1, 7)


#: The route table: exact paths (``{name}`` matches one non-empty segment), methods in
#: declaration order (that order is the ``allow`` header of a 405).
ROUTES: dict[str, dict[str, Endpoint]] = {
    "": {"GET": Endpoint(handlers.root, None, json_get=True)},
    "/": {"GET": Endpoint(handlers.root, None, json_get=True)},
    "/resource_providers": {
        "GET": Endpoint(handlers.list_providers, _RP + "list", json_get=True),
        "POST": Endpoint(handlers.create_provider, _RP + "create", needs_body=always),
    },
    "/resource_providers/{uuid}": {
        "GET": Endpoint(handlers.show_provider, _RP + "show", json_get=True),
        "PUT": Endpoint(handlers.update_provider, _RP + "update", needs_body=always),
        "DELETE": Endpoint(handlers.delete_provider, _RP + "delete"),
    },
    "/resource_providers/{uuid}/inventories": {
        "GET": Endpoint(handlers.list_inventories, _INV + "list", json_get=True),
        "POST": Endpoint(handlers.create_inventory, _INV + "create", needs_body=always),
        "PUT": Endpoint(handlers.set_inventories, _INV + "update", needs_body=always),
        "DELETE": Endpoint(
            handlers.delete_inventories, _INV + "delete", min_version=(1, 5), below_min_status=405
        ),
    },
    "/resource_providers/{uuid}/inventories/{resource_class}": {
        "GET": Endpoint(handlers.show_inventory, _INV + "show", json_get=True),
        "PUT": Endpoint(handlers.update_inventory, _INV + "update", needs_body=always),
        "DELETE": Endpoint(handlers.delete_inventory, _INV + "delete"),
    },
    "/resource_providers/{uuid}/aggregates": {
        "GET": Endpoint(
            handlers.list_aggregates, _RP + "aggregates:list", min_version=(1, 1), json_get=True
        ),
        "PUT": Endpoint(
            handlers.set_aggregates,
            _RP + "aggregates:update",
            min_version=(1, 1),
            needs_body=always,
        ),
    },
    "/resource_providers/{uuid}/usages": {
        "GET": Endpoint(handlers.provider_usages, _RP + "usages", json_get=True),
    },
    "/resource_providers/{uuid}/allocations": {
        "GET": Endpoint(handlers.provider_allocations, _RP + "allocations:list", json_get=True),
    },
    "/resource_providers/{uuid}/traits": {
        "GET": Endpoint(
            handlers.list_provider_traits, _RP + "traits:list", min_version=(1, 6), json_get=True
        ),
        "PUT": Endpoint(
            handlers.set_provider_traits,
            _RP + "traits:update",
            min_version=(1, 6),
            needs_body=always,
        ),
        "DELETE": Endpoint(
            handlers.delete_provider_traits, _RP + "traits:delete", min_version=(1, 6)
        ),
    },
    "/resource_classes": {
        "GET": Endpoint(
            handlers.list_resource_classes, _RC + "list", min_version=(1, 2), json_get=True
        ),
        "POST": Endpoint(
            handlers.create_resource_class, _RC + "create", min_version=(1, 2), needs_body=always
        ),
    },
    "/resource_classes/{name}": {
        "GET": Endpoint(
            handlers.show_resource_class, _RC + "show", min_version=(1, 2), json_get=True
        ),
        "PUT": Endpoint(
            handlers.update_resource_class,
            _RC + "update",
            min_version=(1, 2),
            needs_body=_body_below_1_7,
        ),
        "DELETE": Endpoint(handlers.delete_resource_class, _RC + "delete", min_version=(1, 2)),
    },
    "/traits": {
        "GET": Endpoint(
            handlers.list_traits, _P + "traits:list", min_version=(1, 6), json_get=True
        ),
    },
    "/traits/{name}": {
        "GET": Endpoint(handlers.show_trait, _P + "traits:show", min_version=(1, 6)),
        "PUT": Endpoint(handlers.put_trait, _P + "traits:update", min_version=(1, 6)),
        "DELETE": Endpoint(handlers.delete_trait, _P + "traits:delete", min_version=(1, 6)),
    },
    "/allocations": {
        "POST": Endpoint(
            handlers.post_allocations,
            _P + "allocations:manage",
            min_version=(1, 13),
            needs_body=always,
        ),
    },
    "/allocations/{consumer_uuid}": {
        "GET": Endpoint(handlers.show_allocations, _P + "allocations:list", json_get=True),
        "PUT": Endpoint(handlers.set_allocations, _P + "allocations:update", needs_body=always),
        "DELETE": Endpoint(handlers.delete_allocations, _P + "allocations:delete"),
    },
    "/allocation_candidates": {
        "GET": Endpoint(
            handlers.allocation_candidates,
            _P + "allocation_candidates:list",
            min_version=(1, 10),
            json_get=True,
        ),
    },
    "/usages": {
        "GET": Endpoint(handlers.project_usages, policy.USAGES, min_version=(1, 9), json_get=True),
    },
    "/reshaper": {
        "POST": Endpoint(handlers.reshape, policy.RESHAPE, min_version=(1, 30), needs_body=always),
    },
}


def _compile(routes: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(p.split("/")[1:]) if p else (), p) for p in routes]


_COMPILED = _compile(ROUTES)


def match_route(path: str) -> tuple[str, dict[str, str]] | None:
    """Find the route template and path variables for ``path``; None if nothing matches."""
    if path in ("", "/"):
        return path, {}
    segments = tuple(path.split("/")[1:]) if path.startswith("/") else None
    if segments is None:
        return None
    for pattern, template in _COMPILED:
        if len(pattern) != len(segments) or not pattern:
            continue
        found: dict[str, str] = {}
        for want, got in zip(pattern, segments, strict=True):
            if want.startswith("{"):
                if not got:
                    break
                found[want[1:-1]] = got
            elif want != got:
                break
        else:
            return template, found
    return None


@dataclass(frozen=True)
class CorsConfig:
    """``[cors]`` options: allowed origins and extra allowed request headers."""

    allowed_origins: tuple[str, ...]
    allow_headers: tuple[str, ...] = ()
    allow_methods: tuple[str, ...] = ("GET", "PUT", "POST", "DELETE", "PATCH")
    expose_headers: tuple[str, ...] = (
        "X-Auth-Token",
        "X-Openstack-Request-Id",
        "X-Subject-Token",
        "X-Service-Token",
        "OpenStack-API-Version",
    )
    max_age: int = 3600


@dataclass
class PlacementApp:
    """The WSGI callable serving the Placement API over a PlacementStore."""

    store: PlacementStore
    security: Security = field(default_factory=lambda: default_security())
    cors: CorsConfig | None = None
    routes: dict[str, dict[str, Endpoint]] = field(default_factory=lambda: ROUTES)

    def __call__(
        self, environ: dict[str, Any], start_response: Callable[..., Any]
    ) -> Iterable[bytes]:
        """Serve one WSGI request."""
        # The id the serving middleware gave the request (so logs and the answer agree).
        request_id = environ.get("berth.request_id") or f"req-{uuid_mod.uuid4()}"
        accept = environ.get("HTTP_ACCEPT")
        if accept is None or accept.strip() in ("", "*/*"):
            environ["HTTP_ACCEPT"] = JSON_TYPE
        req = Request(environ, request_id)
        try:
            resp = self._pipeline(req)
        except Exception:  # fault wrapper: never let a traceback reach the client
            LOG.exception("Unexpected error serving %s %s", req.method, req.path)
            resp = render_error(req, 500, "An unexpected error occurred.", code=None)
        resp.set_header("x-openstack-request-id", request_id)
        if self.cors is not None:
            self._cors_actual(req, resp)
        headers = [(k, v) for k, v in resp.headers]
        if resp.body or resp.status not in (204, 201) or resp.get_header("Content-Type"):
            headers.append(("Content-Length", str(len(resp.body))))
        status_line = f"{resp.status} {_reason(resp.status)}"
        start_response(status_line, headers)
        if req.method == "HEAD":
            return [b""]
        return [resp.body]

    # -- pipeline ---------------------------------------------------------------------

    def _pipeline(self, req: Request) -> Response:
        if self.cors is not None and req.method == "OPTIONS":
            origin = req.header("Origin")
            if origin and req.header("Access-Control-Request-Method"):
                return self._cors_preflight(req, origin)
        path = req.path
        identity = self.security.identity
        caller = identity.caller(req.environ)
        if caller is None:
            # The Keystone wrapper lets the empty path through too; noauth2 only "/".
            if path != "/" and not (path == "" and identity.strategy == "keystone"):
                return _unauthorized(identity.challenge)
            caller = Caller(user_id="", project_id=None)
        req.context = caller
        try:
            req.version = extract_version(req.header("OpenStack-API-Version"))
        except InvalidVersion as exc:
            return render_error(req, 400, f"Invalid microversion: {exc}", code=None)
        except UnacceptableVersion as exc:
            return render_error(
                req,
                406,
                f"Invalid microversion: {exc}",
                code=None,
                extra={"max_version": str(MAX_VERSION), "min_version": str(MIN_VERSION)},
            )
        vary = True
        try:
            try:
                # A lost connection is retried (a write only if it surely rolled back);
                # what cannot be retried is a 503 with Retry-After (dbfaults).
                resp = call_with_retry(lambda: self._dispatch(req),
                                       safe=req.method in ("GET", "HEAD"),
                                       what=f"{req.method} {req.path}")
            except BerthUnavailable as exc:
                raise errors.ServiceUnavailable(
                    exc.message, headers=(("Retry-After", str(exc.retry_after)),)) from None
            except sa_exc.DataError as exc:
                # Values the database cannot store (e.g. NUL characters on PostgreSQL) are
                # bad input, not a server fault.
                raise errors.BadRequest(f"Invalid input: {exc.orig}") from None
            except sa_exc.OperationalError as exc:
                if not _transient(exc):
                    raise
                # A deadlock victim or a serialization failure: the client's retry with
                # fresh generations is the remedy.
                raise errors.Conflict(
                    "update conflict: Another thread concurrently updated the data. "
                    "Please retry your update",
                    code=errors.CONCURRENT_UPDATE,
                ) from None
        except errors.PlacementError as exc:
            vary = not exc.outside_handler
            resp = render_error(
                req,
                exc.status,
                exc.message,
                code=exc.code if req.version >= (1, 23) else None,
                headers=exc.headers,
            )
        resp.set_header("openstack-api-version", f"placement {req.version}")
        if vary:
            resp.set_header("vary", "openstack-api-version")
        return resp

    def _dispatch(self, req: Request) -> Response:
        clen = req.header("Content-Length")
        if clen is not None:
            try:
                length = int(clen)
            except ValueError:
                raise errors.BadRequest(
                    "content-length header must be an integer", outside_handler=True
                ) from None
            if length > 0 and req.header("Content-Type") is None:
                raise errors.BadRequest(
                    "content-type header required when content-length > 0", outside_handler=True
                )
        found = match_route(req.path)
        if found is None:
            raise errors.NotFound("", outside_handler=True)
        template, params = found
        methods = self.routes[template]
        endpoint = methods.get(req.method)
        if endpoint is None:
            raise errors.MethodNotAllowed(
                f"The method {req.method} is not allowed for this resource. \n\n "
                + EXPLANATIONS[405],
                headers=(("allow", ", ".join(methods)),),
                outside_handler=True,
            )
        if req.version < endpoint.min_version:
            if endpoint.below_min_status == 405:
                # Placement's versioned handler raises a bare 405 from inside: no detail
                # after WebOb's sentence, and no Allow header.
                raise errors.MethodNotAllowed(
                    f"The method {req.method} is not allowed for this resource. \n\n ")
            raise errors.NotFound("")
        if endpoint.json_get and not accepts_json(req.header("Accept")):
            raise errors.NotAcceptable("Only application/json is provided")
        if endpoint.needs_body is not None and endpoint.needs_body(req.version):
            ctype = req.header("Content-Type")
            media = ctype.split(";")[0].strip().lower() if ctype else None
            if media != JSON_TYPE:
                raise errors.UnsupportedMediaType(
                    f"The media type {ctype} is not supported, use application/json"
                )
        if endpoint.policy is not None:
            assert req.context is not None
            policy.enforce(
                self.security.policy,
                endpoint.policy,
                req.context,
                target_project=req.query_last().get("project_id"),
            )
        return endpoint.func(req, self.store, params)

    # -- CORS -------------------------------------------------------------------------

    def _cors_preflight(self, req: Request, origin: str) -> Response:
        assert self.cors is not None
        resp = empty_response(200)
        resp.set_header("Content-Type", "text/html; charset=UTF-8")
        resp.set_header("Vary", "Origin")
        if origin not in self.cors.allowed_origins and "*" not in self.cors.allowed_origins:
            return resp
        method = (req.header("Access-Control-Request-Method") or "").upper()
        if method not in self.cors.allow_methods:
            return resp
        requested = [
            h.strip() for h in (req.header("Access-Control-Request-Headers") or "").split(",")
        ]
        requested = [h for h in requested if h]
        allowed = {h.lower() for h in self.cors.allow_headers}
        simple = {
            "cache-control",
            "content-language",
            "content-type",
            "expires",
            "last-modified",
            "pragma",
            "accept",
            "accept-language",
        }
        if any(h.lower() not in allowed | simple for h in requested):
            return resp
        resp.set_header("Access-Control-Allow-Origin", origin)
        resp.set_header("Access-Control-Allow-Credentials", "true")
        resp.set_header("Access-Control-Max-Age", str(self.cors.max_age))
        resp.set_header("Access-Control-Allow-Methods", method)
        if requested:
            resp.set_header("Access-Control-Allow-Headers", ",".join(requested))
        return resp

    def _cors_actual(self, req: Request, resp: Response) -> None:
        assert self.cors is not None
        origin = req.header("Origin")
        if not origin or resp.get_header("Access-Control-Allow-Origin"):
            return
        if origin not in self.cors.allowed_origins and "*" not in self.cors.allowed_origins:
            return
        vary = resp.get_header("Vary")
        resp.set_header("Vary", f"{vary},Origin" if vary else "Origin")
        resp.set_header("Access-Control-Allow-Origin", origin)
        resp.set_header("Access-Control-Allow-Credentials", "true")
        resp.set_header("Access-Control-Expose-Headers", ",".join(self.cors.expose_headers))


def _transient(exc: sa_exc.OperationalError) -> bool:
    """Whether a database error is a lost race (deadlock, serialization failure) rather
    than a broken database."""
    pgcode = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
    return pgcode in ("40P01", "40001")


def _reason(status: int) -> str:
    from berth.placement.web import REASONS

    return REASONS.get(status, "Unknown")


def _unauthorized(challenge: str) -> Response:
    """The 401 of a request without a valid token: WebOb's plain JSON body, no version
    header, and where to authenticate."""
    body = {
        "message": EXPLANATIONS[401] + "<br /><br />\n\n",
        "code": "401 Unauthorized",
        "title": "Unauthorized",
    }
    headers = [("Content-Type", JSON_TYPE)]
    if challenge:
        headers.append(("WWW-Authenticate", challenge))
    return Response(status=401, headers=headers, body=json.dumps(body).encode())


def rule_operations() -> dict[str, list[tuple[str, str]]]:
    """Each policy rule with the (method, path) pairs it guards (from the route table)."""
    ops: dict[str, list[tuple[str, str]]] = {}
    for template, methods in ROUTES.items():
        for method, endpoint in methods.items():
            if endpoint.policy is not None:
                ops.setdefault(endpoint.policy, []).append((method, template))
    return ops


def placement_rules() -> list[Any]:
    """Placement's oslo.policy rule defaults."""
    return policy.placement_rules(rule_operations())


def default_security(mode: PolicyMode | str = PolicyMode.LEGACY) -> Security:
    """noauth2 (client role headers ignored) with the ``mode`` rules: for a store served
    in process, and for tests."""
    return Security(identity=NoAuth2(), policy=PolicyEnforcer(placement_rules(), mode=mode))


def make_app(
    store: PlacementStore,
    *,
    security: Security | None = None,
    cors: CorsConfig | None = None,
) -> PlacementApp:
    """Build the WSGI app for a store (noauth2 and the legacy rules unless ``security``
    says otherwise). The app reads the caller that ``security.identity.wrap`` prepares:
    a server wraps the outermost app once."""
    return PlacementApp(store=store, security=security or default_security(), cors=cors)
