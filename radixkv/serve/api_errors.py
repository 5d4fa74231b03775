"""The HTTP errors of the API (OpenAI's error object): APIError, and a 400 naming the first invalid field
of a request body that failed validation."""
from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

from .protocol import UnsupportedField, error_body


class APIError(Exception):
    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param = status, message, type, param

    def response(self) -> JSONResponse:
        return JSONResponse(error_body(self.message, type=self.type, param=self.param, code=self.status),
                            status_code=self.status)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "is-instance"}


def validation_error(errors: Any) -> APIError:
    """400 naming the first invalid field ("messages.0.role"; "body" for unreadable JSON)."""
    err = errors[0] if errors else {}
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, UnsupportedField):
        return APIError(400, str(cause), param=cause.param)
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    # a union reports one error per alternative: name the field, not the alternative
    loc = [p for p in loc if not any(c in p for c in "[]()-") and p not in _TYPE_TAGS and not p[:1].isupper()]
    param = ".".join(loc) or None
    msg = str(err.get("msg", "invalid request body"))
    if err.get("type") == "json_invalid":
        return APIError(400, f"the request body is not valid JSON: {msg}", param="body")
    if err.get("type") == "missing":
        return APIError(400, f"'{param}' is a required field", param=param)
    return APIError(400, f"{param or 'body'}: {msg}", param=param)
