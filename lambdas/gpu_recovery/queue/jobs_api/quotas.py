"""Node quotas through the jobs API: a user's own (admins: anyone's), every quota
(admins), set and remove a limit (admins)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpu_recovery.queue.access import Principal, quota_subject
from gpu_recovery.queue.jobs_api.context import JobsApiContext
from gpu_recovery.queue.jobs_api.errors import Conflict, InvalidRequest
from gpu_recovery.queue.quotas import QuotaInputError, QuotaService, subject_from


def quota_view(context: JobsApiContext, caller: str, user: str | None = None) -> dict[str, Any]:
    """A user's quota at every level (your own; admins may name another user)."""
    subject = quota_subject(caller)
    if user is not None:
        try:
            wanted = subject_from(user)
        except QuotaInputError as error:
            raise InvalidRequest(str(error), error.field) from error
        if wanted != subject:
            context.authorize(lambda a: a.check_admin(Principal.parse(caller), f"read the quota of {user}"))
        subject = wanted
    return _quota_service(context).view(subject)


def quota_list(context: JobsApiContext, caller: str, *, limit: int = 50,
               next_token: str | None = None) -> dict[str, Any]:
    context.authorize(lambda a: a.check_admin(Principal.parse(caller), "list every user's quota"))
    return _quota_call(context, lambda q: q.list_all(limit=limit, next_token=next_token))


def quota_set(context: JobsApiContext, caller: str, user: str, priority: Any,
              max_nodes: Any) -> dict[str, Any]:
    context.authorize(lambda a: a.check_admin(Principal.parse(caller), "set node quotas"))
    result = _quota_call(context, lambda q: q.set_limit(user, priority, max_nodes, by=caller))
    context.trigger("quota changed", "")
    return result


def quota_remove(context: JobsApiContext, caller: str, user: str, priority: Any) -> dict[str, Any]:
    context.authorize(lambda a: a.check_admin(Principal.parse(caller), "remove node quotas"))
    result = _quota_call(context, lambda q: q.remove_limit(user, priority, by=caller))
    context.trigger("quota changed", "")
    return result


def _quota_service(context: JobsApiContext) -> QuotaService:
    if context.quotas is None:
        raise Conflict("node quotas are not configured in this deployment (no quota table)")
    return context.quotas


def _quota_call(context: JobsApiContext, call: Callable[[QuotaService], dict[str, Any]]) -> dict[str, Any]:
    try:
        return call(_quota_service(context))
    except QuotaInputError as error:
        raise InvalidRequest(str(error), error.field) from error
