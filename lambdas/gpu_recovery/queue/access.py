"""Who may do what with the jobs API (pure: no I/O; the handler builds it from settings).

Principals are the IAM identities API Gateway puts in the request context
(``requestContext.identity.userArn``): an IAM user ``arn:aws:iam::<acct>:user/<name>``
or a role session ``arn:aws:sts::<acct>:assumed-role/<role>/<session>``.

Rules, each named in the 403 that applies it:

* ``ownership`` -- a job is read, listed and canceled by its owner (the principal that
  submitted it), by sessions of a *team role* when the job was submitted under that same
  role, and by *admin roles*.
* ``tag_registered`` -- jobs registered from ECS task tags (started on ECS directly, not
  through the queue) have no owner: only admin roles read or cancel them here.
* ``task_definition_family`` -- only families in the allow-list may be submitted; the
  DCGM health-check family never.
* ``task_role`` -- the task definition's task and execution roles must be named with one
  of the allowed prefixes (the stack's ``iam:PassRole`` is limited to the same prefixes).
* ``reserved_priority`` -- priorities from ``reserved_priority_min`` up are for the
  configured roles (and admins).
* ``admin`` -- node quotas are set and removed by admin roles only (everyone reads their
  own).

A configured entry is a role (or user) name, or a full ARN; names match the role of a
role session or the user name, ARNs match the principal's ARN or its role's ARN.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpu_recovery import constants as c

_ARN_RE = re.compile(r"^arn:(?P<partition>aws[a-z-]*):(?P<service>iam|sts)::(?P<account>\d{12}):"
                     r"(?P<resource>.+)$")
RESERVED_PRIORITY_MIN = 40  # VERY_HIGH and EXTREME_HIGH


class Denied(Exception):
    """A request the authorization rules refuse (HTTP 403); ``rule`` names the rule."""

    def __init__(self, rule: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.field = field


@dataclass(frozen=True)
class Principal:
    arn: str
    name: str  # user name, role name, or the ARN itself when it is neither
    role: str | None = None  # role name of a role session
    role_arn: str | None = None

    @classmethod
    def parse(cls, arn: str) -> Principal:
        match = _ARN_RE.match(arn or "")
        if not match:
            return cls(arn=arn, name=arn)
        resource = match["resource"]
        if match["service"] == "sts" and resource.startswith("assumed-role/"):
            parts = resource.split("/")
            role = parts[1] if len(parts) > 1 else ""
            role_arn = f"arn:{match['partition']}:iam::{match['account']}:role/{role}"
            return cls(arn=arn, name=role, role=role, role_arn=role_arn)
        if resource.startswith("role/"):
            role = resource.rsplit("/", 1)[-1]
            return cls(arn=arn, name=role, role=role, role_arn=arn)
        return cls(arn=arn, name=resource.rsplit("/", 1)[-1])

    def matches(self, entries: Iterable[str]) -> bool:
        for entry in entries:
            if entry.startswith("arn:"):
                if entry in (self.arn, self.role_arn):
                    return True
            elif entry == (self.role if self.role is not None else self.name):
                return True
        return False


def quota_subject(arn: str) -> str:
    """The user a job (and its node quota) belongs to: the IAM user name, or
    ``<role>/<session>`` for a role session (an SSO session is named after its user)."""
    match = _ARN_RE.match(arn or "")
    if not match:
        return arn
    resource = match["resource"]
    if match["service"] == "sts" and resource.startswith("assumed-role/"):
        parts = resource.split("/")
        return "/".join(parts[1:3]) if len(parts) > 2 else resource
    return resource.rsplit("/", 1)[-1]


def family_of(task_definition: str) -> str:
    """``arn:...:task-definition/<family>:<rev>`` or ``<family>:<rev>`` -> family."""
    tail = task_definition.rsplit("/", 1)[-1]
    return tail.split(":", 1)[0]


def role_name_of(role_arn: str) -> str:
    return role_arn.rsplit("/", 1)[-1]




@dataclass(frozen=True)
class AccessPolicy:
    admin_roles: tuple[str, ...] = ()
    team_roles: tuple[str, ...] = ()
    allowed_families: tuple[str, ...] = ("*",)  # names, or prefixes ending in '*'
    task_role_prefixes: tuple[str, ...] = ("*",)  # '*' alone: any role
    reserved_priority_roles: tuple[str, ...] = ()
    health_check_families: frozenset[str] = field(
        default_factory=lambda: frozenset({c.DEFAULT_HEALTH_CHECK_FAMILY}))
    reserved_priority_min: int = RESERVED_PRIORITY_MIN

    # ---------------------------------------------------------------- principals
    def is_admin(self, caller: Principal) -> bool:
        return caller.matches(self.admin_roles)

    def team_of(self, caller: Principal) -> str | None:
        """The caller's team role (a configured team role it is a session of)."""
        if caller.role is not None and caller.matches(self.team_roles):
            return caller.role
        return None

    # -------------------------------------------------------------------- jobs
    def check_read(self, caller: Principal, job: Mapping[str, object], action: str = "read") -> None:
        if self.is_admin(caller):
            return
        job_id = job.get("job_id", "?")
        owner = str(job.get("user") or "")
        # A job item without a source was registered from task tags (the repository's
        # default too): never treat it as a queue job someone owns.
        if job.get("source", "ecs-tags") != "queue" or not owner:
            raise Denied("tag_registered",
                         f"job {job_id} was registered from ECS task tags, not submitted through "
                         f"the queue: only an admin role ({self._names(self.admin_roles)}) may "
                         f"{action} it here")
        if owner == caller.arn:
            return
        team = self.team_of(caller)
        if team is not None and job.get("owner_role") == team:
            return
        raise Denied("ownership",
                     f"job {job_id} belongs to {owner}: only its owner, sessions of its team role "
                     f"or an admin role may {action} it")

    def check_cancel(self, caller: Principal, job: Mapping[str, object]) -> None:
        self.check_read(caller, job, action="cancel")

    def check_list(self, caller: Principal, user: str | None) -> None:
        """Listing another principal's jobs: admins, or a team role listing a session of
        the same role."""
        if user is None or user == caller.arn or self.is_admin(caller):
            return
        team = self.team_of(caller)
        if team is not None and Principal.parse(user).role == team:
            return
        raise Denied("ownership", f"only an admin role may list the jobs of {user} "
                                  "(omit user= to list your own jobs)", "user")

    # ------------------------------------------------------------------ submit
    def check_family(self, task_definition: str) -> None:
        family = family_of(task_definition)
        if family in self.health_check_families:
            raise Denied("task_definition_family",
                         f"task definition family {family} is the DCGM health check of the "
                         "recovery system: it is never accepted as a job", "task_definition")
        for allowed in self.allowed_families:
            if family == allowed or (allowed.endswith("*") and family.startswith(allowed[:-1])):
                return
        raise Denied("task_definition_family",
                     f"task definition family {family} is not in the allowed families "
                     f"({', '.join(self.allowed_families) or 'none'}; context allowed_task_families)",
                     "task_definition")

    def check_task_roles(self, role_arns: Iterable[str]) -> None:
        if "*" in self.task_role_prefixes:
            return
        for arn in role_arns:
            name = role_name_of(arn)
            if not any(name.startswith(p.rstrip("*")) for p in self.task_role_prefixes):
                raise Denied("task_role",
                             f"the task definition passes role {name}, whose name does not start "
                             f"with an allowed prefix ({', '.join(self.task_role_prefixes)}; "
                             "context task_role_name_prefixes): the stack may not pass it to ECS",
                             "task_definition")

    def may_use_priority(self, caller: Principal, priority: int) -> bool:
        return (priority < self.reserved_priority_min or self.is_admin(caller)
                or caller.matches(self.reserved_priority_roles))

    def check_admin(self, caller: Principal, action: str) -> None:
        if not self.is_admin(caller):
            raise Denied("admin", f"only an admin role ({self._names(self.admin_roles)}) may {action}")

    def check_priority(self, caller: Principal, priority: int, name: str) -> None:
        if self.may_use_priority(caller, priority):
            return
        raise Denied("reserved_priority",
                     f"priority {name} ({priority}) is reserved to the roles "
                     f"{self._names(self.reserved_priority_roles + self.admin_roles)} "
                     f"(levels >= {self.reserved_priority_min}); choose a lower priority",
                     "priority")

    @staticmethod
    def _names(entries: Iterable[str]) -> str:
        listed = ", ".join(entries)
        return listed or "none configured"
