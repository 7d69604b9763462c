"""Node quotas through the jobs API: a user's own (admins: anyone's), every quota
(admins), set and remove a limit (admins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_recovery.queue.access import Principal, quota_subject
from gpu_recovery.queue.jobs_api.deps import Deps
from gpu_recovery.queue.jobs_api.errors import Conflict, InvalidRequest
from gpu_recovery.queue.quotas import QuotaInputError, QuotaService, subject_from


def quota_view(deps: Deps, caller: str, user: str | None = None) -> dict[str, Any]:
    """A user's quota at every level (your own; admins may name another user)."""
    subject = quota_subject(caller)
    if user is not None:
        try:
            wanted = subject_from(user)
        except QuotaInputError as error:
            raise InvalidRequest(str(error), error.field) from error
        if wanted != subject:
            deps.authorize(lambda a: a.check_admin(Principal.parse(caller), f"read the quota of {user}"))
        subject = wanted
    return _quota_service(deps).view(subject)


def quota_list(deps: Deps, caller: str, *, limit: int = 50, next_token: str | None = None) -> dict[str, Any]:
    deps.authorize(lambda a: a.check_admin(Principal.parse(caller), "list every user's quota"))
    return _quota_call(deps, lambda q: q.list_all(limit=limit, next_token=next_token))


def quota_set(deps: Deps, caller: str, user: str, priority: Any, max_nodes: Any) -> dict[str, Any]:
    deps.authorize(lambda a: a.check_admin(Principal.parse(caller), "set node quotas"))
    result = _quota_call(deps, lambda q: q.set_limit(user, priority, max_nodes, by=caller))
    deps.trigger("quota changed", "")
    return result


def quota_remove(deps: Deps, caller: str, user: str, priority: Any) -> dict[str, Any]:
    deps.authorize(lambda a: a.check_admin(Principal.parse(caller), "remove node quotas"))
    result = _quota_call(deps, lambda q: q.remove_limit(user, priority, by=caller))
    deps.trigger("quota changed", "")
    return result


def _quota_service(deps: Deps) -> QuotaService:
    if deps.quotas is None:
        raise Conflict("node quotas are not configured in this deployment (no quota table)")
    return deps.quotas


def _quota_call(deps: Deps, call: Callable[[QuotaService], dict[str, Any]]) -> dict[str, Any]:
    try:
        return call(_quota_service(deps))
    except QuotaInputError as error:
        raise InvalidRequest(str(error), error.field) from error
