"""The errors the jobs API shows to its caller: HTTP status, code, message, optional field."""

from __future__ import annotations

from typing import Any

from gpu_recovery.queue.access import Denied


class QueueError(Exception):
    """An error the API shows to the caller: HTTP status, message, optional field."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"error": self.code, "message": self.message}
        if self.field:
            body["field"] = self.field
        return body


class InvalidRequest(QueueError):
    status = 400
    code = "validation_error"


class JobNotFound(QueueError):
    status = 404
    code = "not_found"


class Forbidden(QueueError):
    """An authorization rule refused the request; ``code`` is ``forbidden:<rule>``."""

    status = 403

    def __init__(self, denied: Denied) -> None:
        super().__init__(f"{denied.rule}: {denied.message}", denied.field)
        self.code = f"forbidden:{denied.rule}"


class Conflict(QueueError):
    status = 409
    code = "conflict"


class IdempotencyKeyReused(Conflict):
    """The caller's Idempotency-Key already made a job from another body."""

    code = "idempotency_key_reused"

    def __init__(self) -> None:
        super().__init__("Idempotency-Key was already used with a different request body")
