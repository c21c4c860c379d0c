"""OpenAI's error object: every refusal the server makes is `{"error": {"message", "type", "param", "code"}}` with the
HTTP status OpenAI uses for its kind."""

from __future__ import annotations

from typing import Any


class APIError(Exception):
    """A request the server refuses: `status` (HTTP), a message naming the problem, the request field it concerns
    (`param`) and a short machine-readable `code`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict[str, Any]:
        # OpenAI's API calls every refusal of a request an `invalid_request_error`, and its own failures `server_error`.
        kind = "server_error" if self.status >= 500 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}
