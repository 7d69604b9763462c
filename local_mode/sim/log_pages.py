"""GetLogEvents as CloudWatch Logs answers it, for both worlds (the moto world's
``DocumentedAnswers``, the scale world's ``LogsClient``): moto answers a stream whole, in one
page, the moment a line is written; CloudWatch Logs does not.

What the GetLogEvents API reference documents, and :func:`log_page` answers:

* a page holds up to 10,000 events (1 MB), and "a returned page might only be partially
  full, or even empty" while more events exist: here at most ``page_events`` a page, and
  every ``empty_every``-th call (or a call the crash campaigns break in that shape) an empty
  page whose tokens move on, when more events exist in the read's direction;
* the end of the stream is a token coming back as it was passed ("If you have reached the
  end of the stream, it returns the same token you passed in"); tokens are never null;
  a ``nextForwardToken`` is passed back with ``startFromHead`` true (InvalidParameterException
  otherwise, as a token the service cannot read);
* a line is readable only once it was ingested: here ``visible_after`` seconds after it was
  written (an event's ``ingestedAt``, simulated seconds; an event without one was written
  outside the simulation and is readable), so a task's last lines can be unreadable when its
  STOPPED event arrives.

Tokens are ``f/<position>`` (the next forward read starts at that event) and ``b/<position>``
(the next backward read ends before it), counted in the stream's events by timestamp; an
empty page's tokens add ``/<n>`` so that they differ from the token passed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the service's own limit on ``limit`` (and on a page)
MAX_PAGE_EVENTS = 10_000


@dataclass(frozen=True)
class LogPaging:
    """How GetLogEvents pages: ``page_events`` at most a page, every ``empty_every``-th call
    an empty page (0: never), a line readable ``visible_after`` seconds after its timestamp."""

    page_events: int = 5
    empty_every: int = 3
    visible_after: float = 2.0


class InvalidLogToken(ValueError):
    """A ``nextToken`` the service cannot use (InvalidParameterException)."""


def _token(direction: str, position: int, nonce: int = 0) -> str:
    return f"{direction}/{position:020d}" + (f"/{nonce}" if nonce else "")


def _parsed(token: str) -> tuple[str, int]:
    parts = token.split("/")
    if len(parts) not in (2, 3) or parts[0] not in ("f", "b") or not parts[1].isdigit():
        raise InvalidLogToken("The specified nextToken is invalid.")
    return parts[0], int(parts[1])


def log_page(events: Sequence[Mapping[str, Any]], params: Mapping[str, Any], *, now: float,
             paging: LogPaging, empty: bool = False, nonce: int = 1) -> dict[str, Any]:
    """One GetLogEvents answer over ``events`` (the stream's, oldest first: ``timestamp`` in
    milliseconds, ``message``, and ``ingestedAt`` when written in the simulation) at simulated
    time ``now``. ``empty``: this call answers an empty page whose tokens move on (``nonce``,
    at least 1, makes them new), if more events exist in its direction (at the stream's end
    the service answers the token passed; a page "empty while more events exist" is the
    documented case)."""
    horizon = now - paging.visible_after
    start_ms, end_ms = params.get("startTime"), params.get("endTime")
    readable = [e for e in events if (e.get("ingestedAt") is None or e["ingestedAt"] <= horizon)
                and (start_ms is None or e["timestamp"] >= start_ms)
                and (end_ms is None or e["timestamp"] <= end_ms)]
    count = len(readable)
    limit = min(int(params.get("limit") or MAX_PAGE_EVENTS), paging.page_events)
    head = bool(params.get("startFromHead"))
    token = params.get("nextToken")
    if token is None:
        start, end = (0, min(limit, count)) if head else (max(0, count - limit), count)
    else:
        direction, position = _parsed(str(token))
        position = min(position, count)
        if direction == "f":
            if not head:
                raise InvalidLogToken("A nextForwardToken is passed with startFromHead true")
            start, end = position, min(position + limit, count)
        else:
            start, end = max(0, position - limit), position
    if empty and (end > start or (not head and start > 0)):  # an empty page while more events exist
        at = start if head else end
        return {"events": [], "nextForwardToken": _token("f", at, max(nonce, 1)),
                "nextBackwardToken": _token("b", at, max(nonce, 1))}
    page = [{"timestamp": e["timestamp"], "message": e["message"],
             "ingestionTime": int(e["ingestedAt"] * 1000) if e.get("ingestedAt") is not None
             else e.get("ingestionTime", e["timestamp"])} for e in readable[start:end]]
    return {"events": page, "nextForwardToken": _token("f", end), "nextBackwardToken": _token("b", start)}
