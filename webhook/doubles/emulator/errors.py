"""API errors as the real kube-apiserver reports them: `Status` objects (k8s.io/apimachinery
pkg/api/errors), with the same messages, reasons and codes so that clients behave the same."""

from __future__ import annotations

from typing import Any


class ApiStatusError(Exception):
    """An error answer: `to_status()` is the `Status` body, `code` the HTTP status."""

    def __init__(self, code: int, reason: str, message: str,
                 details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details

    def to_status(self) -> dict[str, Any]:
        status: dict[str, Any] = {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            status["reason"] = self.reason
        if self.details:
            status["details"] = self.details
        status["code"] = self.code
        return status


def qualified(group: str, plural: str) -> str:
    """`pods`, `podgroups.scheduling.volcano.sh`: how apiserver messages name a resource."""
    return f"{plural}.{group}" if group else plural


def _details(group: str, kind: str, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name}
    if group:
        details["group"] = group
    details["kind"] = kind
    return details


def not_found(group: str, plural: str, name: str) -> ApiStatusError:
    return ApiStatusError(404, "NotFound", f'{qualified(group, plural)} "{name}" not found',
                          _details(group, plural, name))


def already_exists(group: str, plural: str, name: str) -> ApiStatusError:
    return ApiStatusError(409, "AlreadyExists",
                          f'{qualified(group, plural)} "{name}" already exists',
                          _details(group, plural, name))


def conflict(group: str, plural: str, name: str,
             why: str = "the object has been modified; please apply your changes to the latest "
                        "version and try again") -> ApiStatusError:
    return ApiStatusError(409, "Conflict",
                          f'Operation cannot be fulfilled on {qualified(group, plural)} '
                          f'"{name}": {why}', _details(group, plural, name))


def invalid(group: str, kind: str, name: str,
            causes: list[tuple[str, str, str]]) -> ApiStatusError:
    """causes: (field, reason e.g. FieldValueRequired, message e.g. 'Required value: ...');
    one of each, as 1.37 gives them (1.34 repeated a cause found twice)."""
    causes = list(dict.fromkeys(causes))
    text = ", ".join(f"{field}: {msg}" for field, _, msg in causes)
    if len(causes) > 1:
        text = f"[{text}]"
    details = _details(group, kind, name)
    details["causes"] = [{"reason": r, "message": m, "field": f} for f, r, m in causes]
    return ApiStatusError(422, "Invalid", f'{kind}.{group} "{name}" is invalid: {text}'
                          if group else f'{kind} "{name}" is invalid: {text}', details)


def forbidden(group: str, plural: str, name: str, why: str) -> ApiStatusError:
    return ApiStatusError(403, "Forbidden",
                          f'{qualified(group, plural)} "{name}" is forbidden: {why}',
                          _details(group, plural, name))


def bad_request(message: str) -> ApiStatusError:
    return ApiStatusError(400, "BadRequest", message)


def method_not_allowed() -> ApiStatusError:
    return ApiStatusError(405, "MethodNotAllowed",
                          "the server does not allow this method on the requested resource")


def expired(requested: int, oldest: int) -> ApiStatusError:
    return ApiStatusError(410, "Expired",
                          f"too old resource version: {requested} ({oldest})")


def internal(message: str) -> ApiStatusError:
    return ApiStatusError(500, "InternalError", f"Internal error occurred: {message}",
                          {"causes": [{"message": message}]})


def server_not_found() -> ApiStatusError:
    return ApiStatusError(404, "NotFound",
                          "the server could not find the requested resource",
                          {"causes": [{"reason": "UnexpectedServerResponse",
                                       "message": "404 page not found"}]})
