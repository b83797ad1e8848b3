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
    └── UnsupportedMediaType  415
"""

from __future__ import annotations

UNDEFINED_CODE = "placement.undefined_code"


class PlacementError(Exception):
    """An error with a Placement status, message and ``placement.*`` code."""

    status: int = 500
    title: str = "Internal Server Error"

    def __init__(self, message: str, *, code: str = UNDEFINED_CODE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class BadRequest(PlacementError):
    status = 400
    title = "Bad Request"


class Forbidden(PlacementError):
    status = 403
    title = "Forbidden"


class NotFound(PlacementError):
    status = 404
    title = "Not Found"


class MethodNotAllowed(PlacementError):
    status = 405
    title = "Method Not Allowed"


class NotAcceptable(PlacementError):
    status = 406
    title = "Not Acceptable"


class Conflict(PlacementError):
    status = 409
    title = "Conflict"


class UnsupportedMediaType(PlacementError):
    status = 415
    title = "Unsupported Media Type"
