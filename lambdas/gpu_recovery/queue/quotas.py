"""Node quotas: who may hold how many nodes at once at each priority level.

Administrators set, list and remove them (jobs API ``/v1/quotas``, ``gpu-recovery-admin
quota``); users see their own (``gpujobs quota``). A quota's subject is the user a job
belongs to: the IAM user name, or ``<role>/<session>`` for a role session (see
:func:`gpu_recovery.queue.access.quota_subject`). The usage beside each limit is what the
scheduler charged (it is released on the tick after a job stops holding nodes).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import QUOTA_PK, QUOTA_SK
from gpu_recovery.domain.time_sharing import (
    LEVELS_HIGH_TO_LOW,
    QuotaBook,
    parse_priority,
    priority_name,
)
from gpu_recovery.queue.access import quota_subject
from gpu_recovery.repository.time_sharing import QuotaRepository

MAX_QUOTA_NODES = 100_000
MAX_PAGE = 100


class QuotaInputError(ValueError):
    """A bad quota request; ``field`` names what to fix."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message)
        self.field = field


def subject_from(user: str) -> str:
    """An IAM ARN (user or role session) or a subject as shown by ``gpujobs quota``."""
    text = (user or "").strip()
    if not text or len(text) > 512:
        raise QuotaInputError("user: must be an IAM ARN or a user name (1-512 characters)", "user")
    if "#" in text:
        raise QuotaInputError("user: must not contain '#'", "user")
    return quota_subject(text) if text.startswith("arn:") else text


def level_from(priority: Any) -> int:
    try:
        return parse_priority(priority)
    except (TypeError, ValueError) as error:
        raise QuotaInputError(f"priority: {error}", "priority") from error


class QuotaService:
    def __init__(self, repo: QuotaRepository, defaults: Mapping[int, int] | None = None) -> None:
        self.repo = repo
        self.defaults = dict(defaults or {})

    def book(self) -> QuotaBook:
        return QuotaBook(self.defaults, self.repo.entry)

    # ------------------------------------------------------------------- reads
    def view(self, subject: str) -> dict[str, Any]:
        """Every level of one user: its limit (set or default), usage and room."""
        stored = {int(i["priority"]): i for i in self.repo.of_subject(subject)}
        levels = []
        for level in LEVELS_HIGH_TO_LOW:
            item = stored.get(level, {})
            explicit = item.get("max_nodes")
            limit = int(explicit) if explicit is not None else self.defaults.get(level)
            used = max(0, int(item.get("used_nodes") or 0))
            levels.append({
                "priority": level, "priority_name": priority_name(level),
                "max_nodes": limit, "source": "set" if explicit is not None else
                ("default" if limit is not None else "unlimited"),
                "used_nodes": used, "room": None if limit is None else max(0, limit - used)})
        return {"user": subject, "quotas": levels}

    def list_all(self, *, limit: int = 50, next_token: str | None = None) -> dict[str, Any]:
        """Every stored quota item (set limits and usage), a page at a time."""
        if not 1 <= limit <= MAX_PAGE:
            raise QuotaInputError(f"limit: must be between 1 and {MAX_PAGE}", "limit")
        start = _decode(next_token) if next_token else None
        items, last = self.repo.page(limit, start)
        return {"quotas": [_row(i, self.defaults) for i in items],
                "next_token": _encode(last) if last else None}

    # ------------------------------------------------------------------ writes
    def set_limit(self, user: str, priority: Any, max_nodes: Any, *, by: str) -> dict[str, Any]:
        subject, level = subject_from(user), level_from(priority)
        if isinstance(max_nodes, bool) or not isinstance(max_nodes, int) \
                or not 0 <= max_nodes <= MAX_QUOTA_NODES:
            raise QuotaInputError(f"max_nodes: must be an integer 0..{MAX_QUOTA_NODES}", "max_nodes")
        item = self.repo.set_limit(subject, level, max_nodes, by=by, now=clock.now()) or {}
        return _row(item, self.defaults)

    def remove_limit(self, user: str, priority: Any, *, by: str) -> dict[str, Any]:
        subject, level = subject_from(user), level_from(priority)
        removed = self.repo.remove_limit(subject, level, by=by, now=clock.now())
        default = self.defaults.get(level)
        return {"user": subject, "priority": level, "priority_name": priority_name(level),
                "removed": removed, "max_nodes": default,
                "source": "default" if default is not None else "unlimited"}


def _row(item: Mapping[str, Any], defaults: Mapping[int, int]) -> dict[str, Any]:
    level = int(item.get("priority") or 0)
    explicit = item.get("max_nodes")
    limit = int(explicit) if explicit is not None else defaults.get(level)
    used = max(0, int(item.get("used_nodes") or 0))
    return {"user": str(item.get("subject", "")), "priority": level, "priority_name": priority_name(level),
            "max_nodes": limit,
            "source": "set" if explicit is not None else ("default" if limit is not None else "unlimited"),
            "used_nodes": used, "room": None if limit is None else max(0, limit - used)}


def _encode(key: Mapping[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(dict(key), sort_keys=True).encode()).decode().rstrip("=")


def _decode(token: str) -> dict[str, Any]:
    try:
        value = json.loads(base64.urlsafe_b64decode((token + "=" * (-len(token) % 4)).encode()))
    except (binascii.Error, ValueError, UnicodeDecodeError) as error:
        raise QuotaInputError("next_token: is not a token this API returned", "next_token") from error
    if not isinstance(value, dict) or set(value) != {QUOTA_PK, QUOTA_SK} \
            or not all(isinstance(v, str) for v in value.values()):
        raise QuotaInputError("next_token: is not a token this API returned", "next_token")
    return value
