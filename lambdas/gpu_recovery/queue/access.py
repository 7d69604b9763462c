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
* ``task_network`` -- a job's ``network`` (the subnets and security groups its tasks are
  started in, by the launcher's role) only from the deployment's allow-list
  (``allowed_task_networks``, optionally per principal); none configured: no job may name
  a network (a job without one is unaffected).

A configured entry is a role (or user) name, or a full ARN; names match the role of a
role session or the user name, ARNs match the principal's ARN or its role's ARN.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_recovery import constants as c
from gpu_recovery.domain.models import family_of
from gpu_recovery.domain.task_network import SECURITY_GROUP_ID, SUBNET_ID

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


def role_name_of(role_arn: str) -> str:
    return role_arn.rsplit("/", 1)[-1]


ANY = "*"
_PRINCIPAL_ENTRY = re.compile(
    r"^([\w+=,.@-]{1,64}|arn:aws[a-z-]*:(iam|sts)::\d{12}:[\w+=,.@/-]{1,512})$")
NETWORK_EXAMPLE = ('[{"subnets": ["subnet-0a1b2c3d"], "security_groups": ["sg-0a1b2c3d"]}, '
                   '{"subnets": ["subnet-0e1f2a3b"], "security_groups": ["sg-0e1f2a3b"], '
                   '"principals": ["ml-team"]}]')


@dataclass(frozen=True)
class NetworkGrant:
    """Subnets and security groups jobs may name (``*``: any), for ``principals`` (role
    or user names, ARNs; none: every caller)."""

    subnets: tuple[str, ...]
    security_groups: tuple[str, ...]
    principals: tuple[str, ...] = ()


def parse_allowed_networks(text: str) -> tuple[NetworkGrant, ...]:
    """The ``allowed_task_networks`` allow-list (JSON list of grants; "" or [] : none).
    ValueError says what is wrong, with an example."""
    if not text.strip():
        return ()
    try:
        raw = json.loads(text)
    except ValueError as error:
        raise ValueError(f"not JSON ({error}): e.g. {NETWORK_EXAMPLE}") from error
    if not isinstance(raw, list):
        raise ValueError(f"must be a JSON list of grants, e.g. {NETWORK_EXAMPLE}")
    return tuple(_grant(i, entry) for i, entry in enumerate(raw))


def _grant(index: int, entry: Any) -> NetworkGrant:
    where = f"grant {index}"
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: must be an object with subnets and security_groups, "
                         f"e.g. {NETWORK_EXAMPLE}")
    unknown = sorted(set(entry) - {"subnets", "security_groups", "principals"})
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} "
                         "(subnets, security_groups, principals)")

    def ids(name: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
        values = entry.get(name, [])
        if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
            raise ValueError(f"{where}: {name} must be a list of {what}")
        for value in values:
            if value != ANY and not pattern.match(value):
                raise ValueError(f"{where}: {value!r} is not a valid {what[:-1]} (or '*')")
        return tuple(dict.fromkeys(values))

    subnets = ids("subnets", SUBNET_ID, "subnet ids")
    groups = ids("security_groups", SECURITY_GROUP_ID, "security group ids")
    principals = ids("principals", _PRINCIPAL_ENTRY, "IAM role or user names / ARNs")
    if not subnets and not groups:
        raise ValueError(f"{where}: names no subnet and no security group")
    return NetworkGrant(subnets, groups, principals)




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
    allowed_networks: tuple[NetworkGrant, ...] = ()  # none: no job may name a network

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

    def check_network(self, caller: Principal, subnets: Sequence[str],
                      security_groups: Sequence[str]) -> None:
        """A job's network: every subnet and security group in a grant of the allow-list
        that applies to ``caller`` (no security group: the VPC's default group, which only
        a grant of any group (``*``) allows). Admin roles are held to it too: the network is
        what the launcher's role starts tasks in, not what the caller may read."""
        how = ("an operator lists the subnets and security groups jobs may use in the CDK context key "
               "allowed_task_networks (docs/configuration.md)")
        if not self.allowed_networks:
            raise Denied("task_network",
                         f"network: this deployment allows no task networks (subnet "
                         f"{', '.join(subnets)}; security groups {', '.join(security_groups) or 'none'}): "
                         f"{how}, or leave network out", "network")
        grants = [g for g in self.allowed_networks if not g.principals or caller.matches(g.principals)]
        allowed_subnets = tuple(dict.fromkeys(s for g in grants for s in g.subnets))
        allowed_groups = tuple(dict.fromkeys(s for g in grants for s in g.security_groups))
        for subnet in subnets:
            if subnet not in allowed_subnets and ANY not in allowed_subnets:
                raise Denied("task_network",
                             f"network: subnet {subnet} is not in the subnets allowed to {caller.name} "
                             f"({', '.join(allowed_subnets) or 'none'}): {how}", "network")
        if not security_groups and ANY not in allowed_groups:
            raise Denied("task_network",
                         "network: no security group named (ECS would use the VPC's default group, which "
                         f"is not allowed): name one of {', '.join(allowed_groups) or 'none'}", "network")
        for group in security_groups:
            if group not in allowed_groups and ANY not in allowed_groups:
                raise Denied("task_network",
                             f"network: security group {group} is not in the security groups allowed to "
                             f"{caller.name} ({', '.join(allowed_groups) or 'none'}): {how}", "network")

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
