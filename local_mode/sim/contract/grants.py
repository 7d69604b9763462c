"""The grants guard: every AWS call a Lambda function makes in a simulated run must be allowed
by that function's own role, as the synthesized template grants it.

**Which function is calling.** The innermost frame of a handler module
(``handlers.<module>``: its ``lambda_handler``, or its ``handle`` as the scale world and the
heartbeat sweep's local thread call it) on the calling thread's stack names the deployed
function (``grants.json`` maps each handler module to its function, role and statements).
That covers every way the simulation runs a function: the moto world's bus and its queues
(``sim.bus``, ``sim.wiring``), the local API server (the node API, the jobs API, the
job-control API and both authorizers, ``local_mode.server``), the jobs API's in-process
scheduler trigger, the scale world's containers (``scale_recovery.on_container``) and tests
that call a handler themselves. A call with no handler on the stack (test set-up, the CLIs as
an operator, the simulation's own clients) is nobody's and is not checked.

**What it needs.** :mod:`.authorization`: the IAM action(s), resource ARN(s) and condition
keys per operation (a transaction per item, ``ListTasks`` without a container instance on
``*``...). The function's *platform* needs (its log group, X-Ray, its SQS event source, its
on-failure destination: what Lambda does with the role) are checked the first time the guard
sees the function.

**The evaluator.** :mod:`.iam`, our own, not moto's IAM access control: moto authorizes per
HTTP request against the moto IAM user or assumed role of the request's access key (one
action, ``<service>:<operation>``, per request: no per-item transaction actions), evaluates
the resource only where a service passes one (SQS, S3, IAM; ECS and DynamoDB are checked
against ``*``) and conditions only against the request's own parameters (no ``ecs:cluster``,
no resource tags, no ``dynamodb:LeadingKeys``), starts only after
``INITIAL_NO_AUTH_ACTION_COUNT`` requests, and never sees the in-memory DynamoDB nor the
scale world's stand-in clients (moto 5.2: ``moto/core/authorization.py``,
``moto/iam/access_control.py``). All our functions share one botocore session, too, so
moto's per-access-key identity would need one credential per function.

**A missing grant** raises :class:`GrantDenied` (not a ``ClientError``: the product's
``except ClientError`` cannot take it for AWS's AccessDenied and go on) naming the function,
the action, the resource and why; it is also recorded on the guard (``LocalAws.grants``) and
in this process's list (:func:`recorded_denials`), so a run that swallowed it still fails
(tests/conftest.py fails the test, a crash campaign's run counts it as a problem).

``GPU_RECOVERY_GRANTS=record`` (surveying a branch: every denial of a run at once) records
denials without raising them; the test still fails.

**Grants no run uses.** Each guard adds what it allowed to this process's usage
(:data:`USAGE`); with ``GRANTS_USAGE_DIR`` set, the test session writes it there
(``usage.write_usage``) and ``python -m local_mode.sim.contract grants --unused DIR`` lists the
statements no run used; ``--operations DIR`` prints each function's operations.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from gpu_recovery import constants as C

from . import grants_file
from .authorization import Facts, Need, UnknownOperation, needs, queue_arn
from .iam import Decision, PolicySet, Statement

#: ``record``: denials are recorded, not raised (a survey of every denial of a run)
RECORD_ONLY_ENV = "GPU_RECOVERY_GRANTS"
#: the deployed default of ``instance_tag_key`` (infra/config) and the simulated nodes' tag
INSTANCE_TAG_KEY = "gpu-recovery:cluster"
#: the grants of a configuration option, added when the run's settings choose it
VARIANTS: dict[str, Callable[[Mapping[str, str]], bool]] = {
    "replace_action=terminate_in_asg":
        lambda env: _remediation(env).get("replace_action") == "terminate_in_asg",
}


@functools.lru_cache(maxsize=64)
def _variants_of(remediation_settings: str) -> frozenset[str]:
    """The variants a run's settings turn on (every variant reads the remediation settings)."""
    env = {C.ENV_REMEDIATION_SETTINGS: remediation_settings}
    return frozenset(name for name, active in VARIANTS.items() if active(env))


def _remediation(env: Mapping[str, str]) -> dict[str, Any]:
    raw = (env.get(C.ENV_REMEDIATION_SETTINGS) or "").strip()
    try:
        value = json.loads(raw) if raw else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class GrantDenied(Exception):
    """A call the calling function's role does not allow (what AWS would refuse with
    AccessDenied). Deliberately not a ``ClientError``."""

    def __init__(self, function: str, action: str, resource: str, why: str, operation: str = "") -> None:
        self.function, self.action, self.resource, self.why, self.operation = (
            function, action, resource, why, operation)
        via = f" (calling {operation})" if operation else ""
        super().__init__(f"{function} is not allowed {action} on {resource}{via}: {why}")


# ================================================================ which function runs
#: a frame's module name (its globals' ``__name__``) -> the handler module it is, or None.
#: Keyed by the name, not the frame's code object: a code object's hash is computed anew on
#: every lookup (its bytecode, constants and names), which made this walk ~2.5 % of a crash
#: campaign's CPU. The answer is a pure function of the name, so the cache never goes stale.
_HANDLER_OF_MODULE: dict[str, str | None] = {}
_HANDLER_PREFIX = "handlers."


def _handler_module(name: str) -> str | None:
    module = name[len(_HANDLER_PREFIX):] if name.startswith(_HANDLER_PREFIX) else None
    if module is not None and (module.startswith("_") or "." in module):
        module = None  # the handlers' shared helpers (handlers._common...) are no function
    return module


def executing_function(functions: Mapping[str, Any], frame: FrameType | None = None) -> str | None:
    """The handler module (a key of ``functions``) of the innermost handler frame on this
    thread's stack, or None."""
    frame = frame or sys._getframe(1)
    handler_of = _HANDLER_OF_MODULE
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        try:
            module = handler_of[name]
        except KeyError:
            module = handler_of[name] = _handler_module(str(name))
        except TypeError:  # an unhashable __name__ (a namespace's own business)
            module = _handler_module(str(name))
        if module is not None and module in functions:
            return module
        frame = frame.f_back
    return None


# ================================================================ placeholders
def resolver(*, region: str, account: str, cluster: str, tables: Mapping[str, str],
             topic_arn: str, queues: Mapping[str, str], log_groups: Mapping[str, str],
             reboot_document: str, instance_tag_key: str = INSTANCE_TAG_KEY,
             instance_tag_value: str | None = None) -> Callable[[str], str]:
    """``${...}`` of the grants file -> this world's values. ``tables``: symbol suffix
    ("job", "instance", ...) -> table name; ``queues``: "gang" / "tag-lookups" -> URL;
    ``log_groups``: "health-check" / "gpu-reset" -> name."""
    fixed = {"account": account, "region": region, "cluster": cluster, "instance_tag_key": instance_tag_key,
             "instance_tag_value": instance_tag_value if instance_tag_value is not None else cluster}

    def symbol(name: str) -> str:
        if name in fixed:
            return fixed[name]
        ref, _, attribute = name.rpartition(".")
        kind, _, rest = ref.partition(":")
        arn: str | None = None
        value: str | None = None
        if kind == "table" and rest in tables:
            value, arn = tables[rest], f"arn:aws:dynamodb:{region}:{account}:table/{tables[rest]}"
        elif kind == "topic":
            value = arn = topic_arn
        elif kind == "key":
            arn = f"arn:aws:kms:{region}:{account}:key/{rest}-topic-key"
        elif kind == "queue" and rest in queues:
            value, arn = queues[rest], queue_arn(queues[rest])
        elif kind == "queue" and rest.startswith("dlq:"):
            value = rest[4:] + "-dlq"
            arn = f"arn:aws:sqs:{region}:{account}:{value}"
        elif kind == "function":
            value, arn = rest, f"arn:aws:lambda:{region}:{account}:function:{rest}"
        elif kind == "log-group":
            value = f"/aws/lambda/{rest[9:]}" if rest.startswith("function:") else log_groups.get(rest)
            arn = f"arn:aws:logs:{region}:{account}:log-group:{value}:*" if value else None
        elif kind == "document":
            value = reboot_document
            arn = f"arn:aws:ssm:{region}:{account}:document/{reboot_document}"
        elif kind == "role":
            value = rest.replace(":", "-")
            arn = f"arn:aws:iam::{account}:role/{value}"
        resolved = arn if attribute == "Arn" else value
        if resolved is None:
            raise KeyError(f"the grants file names ${{{name}}}, which this world cannot resolve "
                           "(local_mode/sim/contract/grants.py resolver)")
        return resolved

    def resolve(text: str) -> str:
        out, rest = [], text
        while "${" in rest:
            before, _, tail = rest.partition("${")
            name, _, rest = tail.partition("}")
            out += [before, symbol(name)]
        return "".join([*out, rest])

    return resolve


def _resolved(node: Any, resolve: Callable[[str], str]) -> Any:
    if isinstance(node, str):
        return resolve(node)
    if isinstance(node, list):
        return [_resolved(n, resolve) for n in node]
    if isinstance(node, dict):
        return {resolve(k): _resolved(v, resolve) for k, v in node.items()}
    return node


# ================================================================ usage
@dataclass
class Usage:
    """What the guards of this process allowed: statement ids used, and each function's
    operations (function, ``service:Operation``, action, resource form, statement id)."""

    statements: set[str] = field(default_factory=set)
    operations: Counter[tuple[str, str, str, str, str]] = field(default_factory=Counter)

    def merge(self, other: Usage) -> None:
        self.statements |= other.statements
        self.operations.update(other.operations)


#: this process's usage (every guard adds to it)
USAGE = Usage()
_DENIALS: list[GrantDenied] = []
_lock = threading.Lock()


def recorded_denials() -> list[GrantDenied]:
    """Every denial of every guard of this process so far (tests/conftest.py reads it)."""
    with _lock:
        return list(_DENIALS)


@contextmanager
def expecting_denials() -> Iterator[list[GrantDenied]]:
    """For the guard's own tests: denials made inside are handed over instead of failing the test."""
    with _lock:
        start = len(_DENIALS)
    taken: list[GrantDenied] = []
    try:
        yield taken
    finally:
        with _lock:
            taken.extend(_DENIALS[start:])
            del _DENIALS[start:]


def statement_id(module: str, index: int, variant: str = "") -> str:
    return f"{module}#{variant}#{index}" if variant else f"{module}#{index}"


# ================================================================ the guard
@dataclass
class _Function:
    module: str
    name: str
    base: PolicySet
    variants: dict[str, PolicySet]
    platform: list[tuple[str, str, str]]  # (action, resource, why)
    platform_checked: bool = False
    _with: dict[frozenset[str], PolicySet] = field(default_factory=dict)

    def policies(self, active: frozenset[str]) -> PolicySet:
        if not active or not self.variants:
            return self.base
        chosen = active & set(self.variants)
        if not chosen:
            return self.base
        found = self._with.get(frozenset(chosen))
        if found is None:
            statements = list(self.base.statements)
            for name in sorted(chosen):
                statements += self.variants[name].statements
            found = self._with[frozenset(chosen)] = PolicySet(statements)
        return found


class GrantsGuard:
    """One world's guard (see the module docstring): ``check`` a call (or let
    :meth:`install` hook every call of a botocore session)."""

    def __init__(self, facts: Facts, resolve: Callable[[str], str], *,
                 data: Mapping[str, Any] | None = None, env: Mapping[str, str] | None = None) -> None:
        self.facts = facts
        self.env = env if env is not None else os.environ
        data = data if data is not None else _file()
        self.functions: dict[str, _Function] = {}
        for module, entry in data["functions"].items():
            def compiled(raw: list[Any], variant: str = "", module: str = module) -> PolicySet:
                return PolicySet(
                    Statement.from_json(i, _resolved(s, resolve), statement_id(module, i, variant))
                    for i, s in enumerate(raw))

            self.functions[module] = _Function(
                module, entry["function"], compiled(entry["statements"]),
                {name: compiled(by_module.get(module, []), name)
                 for name, by_module in data.get("variants", {}).items() if by_module.get(module)},
                [(p["action"], resolve(p["resource"]), p["why"]) for p in entry.get("platform", [])])
        self.denials: list[GrantDenied] = []
        self.usage = Usage()
        self._lock = threading.Lock()

    # --------------------------------------------------------------- hooks
    def install(self, session: Any) -> None:
        """Check every call of ``session``'s clients before it is built (the caller's own
        parameters; a refused call never reaches the emulator)."""
        session.events.register("before-parameter-build", self._before_parameter_build)

    def uninstall(self, session: Any) -> None:
        session.events.unregister("before-parameter-build", self._before_parameter_build)

    def _before_parameter_build(self, params: Mapping[str, Any], model: Any, **_: Any) -> None:
        self.check(model.service_model.service_name, model.name, params)

    # --------------------------------------------------------------- checks
    def check(self, service: str, operation: str, params: Mapping[str, Any], *,
              function: str | None = None) -> None:
        """Raise :class:`GrantDenied` unless the calling function's role allows the call
        (no function on the stack: nothing to check)."""
        module = function or executing_function(self.functions)
        if module is None:
            return
        fn = self.functions[module]
        if not fn.platform_checked:
            fn.platform_checked = True
            for action, resource, _why in fn.platform:
                self._require(fn, Need(action, resource, form=resource), "Lambda service")
        try:
            wanted = needs(service, operation, params, self.facts)
        except UnknownOperation as unknown:
            self._deny(GrantDenied(fn.name, str(unknown), "?", "the grants guard does not know what this "
                                   "operation is authorized against: add it to local_mode/sim/contract/"
                                   "authorization.py", f"{service}:{operation}"))
            return
        if not wanted:
            return
        policies = fn.policies(self._active_variants())  # the settings are read once a call
        for need in wanted:
            self._require(fn, need, f"{service}:{operation}", policies)

    def _active_variants(self) -> frozenset[str]:
        return _variants_of(self.env.get(C.ENV_REMEDIATION_SETTINGS) or "")

    def _require(self, fn: _Function, need: Need, operation: str, policies: PolicySet | None = None) -> None:
        if policies is None:
            policies = fn.policies(self._active_variants())
        decision = policies.decide(need.action, need.resource, need.context)
        if decision.allowed and decision.allowed_by is not None:
            sid = decision.allowed_by.ident
            key = (fn.module, operation, need.action, need.form or need.resource, sid)
            for usage in (self.usage, USAGE):  # no lock: a count lost to a race only skews a report
                usage.statements.add(sid)
                usage.operations[key] += 1
            return
        self._deny(GrantDenied(fn.name, need.action, need.resource, _why(decision, need), operation))

    def _deny(self, denial: GrantDenied) -> None:
        with self._lock:
            self.denials.append(denial)
        with _lock:
            _DENIALS.append(denial)
        if self.env.get(RECORD_ONLY_ENV) != "record":
            raise denial


def _why(decision: Decision, need: Need) -> str:
    if decision.denied_by is not None:
        return f"explicitly denied by statement {decision.denied_by.sid or decision.denied_by.index}"
    if decision.unknown:
        parts = [f"{s.sid or s.index} conditions on {', '.join(keys)}" for s, keys in decision.unknown]
        return "a statement could not be evaluated (condition keys the guard does not supply for this " \
               f"action): {'; '.join(parts)}"
    if decision.failed_conditions:
        names = ", ".join(str(s.sid or s.index) for s in decision.failed_conditions)
        given = {k: v for k, v in need.context.items()}
        return f"the conditions of {names} do not hold (request: {given})"
    return "no statement of its role allows it"


_file_cache: dict[str, Any] = {}


def _file() -> dict[str, Any]:
    if "data" not in _file_cache:
        _file_cache["data"] = grants_file.read()
    return dict(_file_cache["data"])
