"""Placement wire errors.

Every error the HTTP layer turns into Placement's JSON error body derives from
``PlacementError``; the status, the specific message (verbatim from the reference's
Appendix A) and the stable ``placement.*`` code travel together so that the handler,
the store and the allocation-candidate engine never format wire text themselves.

    PlacementError
    ├── BadRequest            400
    ├── Forbidden             403
    ├── NotFound              404
    ├── MethodNotAllowed      405
    ├── NotAcceptable         406
    ├── Conflict              409
    ├── UnsupportedMediaType  415
    └── ServiceUnavailable    503  (the database is unreachable or locked; Retry-After)
"""

from __future__ import annotations

UNDEFINED_CODE = "placement.undefined_code"
CONCURRENT_UPDATE = "placement.concurrent_update"
INVENTORY_INUSE = "placement.inventory.inuse"
DUPLICATE_NAME = "placement.duplicate_name"
PROVIDER_IN_USE = "placement.resource_provider.inuse"
PROVIDER_CANNOT_DELETE_PARENT = "placement.resource_provider.cannot_delete_parent"
RESOURCE_PROVIDER_NOT_FOUND = "placement.resource_provider.not_found"
QUERY_DUPLICATE_KEY = "placement.query.duplicate_key"
QUERY_BAD_VALUE = "placement.query.bad_value"
QUERY_MISSING_VALUE = "placement.query.missing_value"


class PlacementError(Exception):
    """An error with a Placement status, message and ``placement.*`` code."""

    status: int = 500
    title: str = "Internal Server Error"

    def __init__(
        self,
        message: str,
        *,
        code: str = UNDEFINED_CODE,
        outside_handler: bool = False,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        # Placement adds ``vary: openstack-api-version`` only to responses its handlers
        # return; errors raised by the router, the policy layer or a NotFound escaping
        # the object layer lack it (reference 1.3 quirk). Such raisers set this flag.
        self.outside_handler = outside_handler
        # Extra response headers, e.g. ``allow`` on a 405.
        self.headers = headers


class BadRequest(PlacementError):
    """The request is malformed or violates a rule (400)."""

    status = 400
    title = "Bad Request"


class Forbidden(PlacementError):
    """Policy denies the action (403)."""

    status = 403
    title = "Forbidden"


class NotFound(PlacementError):
    """The resource or route does not exist (404)."""

    status = 404
    title = "Not Found"


class MethodNotAllowed(PlacementError):
    """The route exists but not for this method (405)."""

    status = 405
    title = "Method Not Allowed"


class NotAcceptable(PlacementError):
    """No acceptable representation or version (406)."""

    status = 406
    title = "Not Acceptable"


class Conflict(PlacementError):
    """A generation, uniqueness or capacity conflict (409)."""

    status = 409
    title = "Conflict"


class UnsupportedMediaType(PlacementError):
    """The request body is not application/json (415)."""

    status = 415
    title = "Unsupported Media Type"


class ServiceUnavailable(PlacementError):
    """The database is unreachable or locked past its timeout (after the retries that
    were safe): try again after ``Retry-After`` seconds."""

    status = 503
    title = "Service Unavailable"
