"""What an AWS error means for a side effect that may have to be repeated."""

from __future__ import annotations

from botocore.exceptions import ClientError


def refused(error: BaseException) -> bool:
    """The service answered with a client error (throttled, invalid, denied): the call
    did nothing, so repeating it cannot do it twice.

    Anything else (a 5xx, a timeout, a dropped connection, a crash) may have executed:
    the caller must look the effect up before repeating it.
    """
    if not isinstance(error, ClientError):
        return False
    status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
    return 400 <= status < 500


#: set on an error that stopped a call before it was sent (``not_sent``)
NOT_SENT = "call_not_sent"


def not_sent(error: BaseException) -> bool:
    """The call was never sent: its turn in the stack's ECS budget could not be had (the budget
    said no, or its own read or write failed). Like a refusal, it did nothing."""
    return bool(getattr(error, NOT_SENT, False))
