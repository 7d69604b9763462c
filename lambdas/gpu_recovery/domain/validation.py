"""Validation after repair: a repaired node proves itself under load before it takes work. Pure.

A node the stack rebooted, whose GPUs it reset, or that replaced a node it terminated is not
handed back when its agent reconnects (or the reset exits 0): it first runs the health-check
task again as a *validation*, a DCGM diag at ``dcgm_level`` followed by ``load_seconds`` of
GPU load (DCGM's targeted-stress plugin), judged by the health check's own exit-code
contract (``health_check/README.md``). Until the validation passes the node stays in repair
(REBOOTING, its ``validation`` under way), so nothing places on it: the stack's restarts,
relocations, spares and queue launches read the instance item; every other scheduler reads
the placement attribute ``gpu-recovery.unavailable=validating``.

Why: operators of large fleets see nodes that pass idle checks after a reboot and fail again
minutes into real training (NVSentinel issue 695, which led to its post-remediation
validation); SageMaker HyperPod's deep health checks stress a node before it goes back.

* **pass** (exit 0): the node is AVAILABLE and the jobs waiting for it restart;
* **fail** (exit 1-4): the verdict goes through the fault catalog as new evidence
  (trigger ``validation``), and the escalation counts it under the cause of the repair that
  did not hold (:func:`repair_cause`), so the node climbs the same ladder a job
  would otherwise have paid for: reset, reset, reboot, reboot, replace (or quarantine and page
  after ``max_remediations``), within the breaker. A loop is impossible: every failure is an
  executed remediation of one cause, and escalation caps both;
* **no verdict** (the task ended without one, or ran out of its time, :func:`task_time_up`):
  never a failed repair, since a missing answer condemns no node: the node stays validating,
  out of service, and the task is run again (``START_RETRIES`` times, then an operator is
  told and it goes on being tried). A GPU that hangs under load gives its own verdict: the
  task bounds its load with ``timeout(1)``, whose exit 124 is ``reboot`` in the health
  check's contract.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from enum import Enum
from typing import Any

from gpu_recovery.domain import started_by as task_started_by
from gpu_recovery.domain.classify import Decision
from gpu_recovery.domain.fault_vocabulary import NODE_ACTIONS, Action, Budget
from gpu_recovery.domain.models import (
    LOST_NODE_ORIGIN,
    OPERATOR_CHECK_FAILED_ORIGIN,
    OPERATOR_RETURN_ORIGIN,
    RECONNECT_CHECK_FAILED_ORIGIN,
)
from gpu_recovery.domain.states import DcgmVerdict


class Repair(str, Enum):
    """What was done to the node before its validation."""

    REBOOT = "reboot"
    GPU_RESET = "gpu_reset"
    REPLACEMENT = "replacement"  # a new node in place of one the stack terminated
    # None: a lost node flagged SUSPECT on a missing answer, its ECS agent connected again
    # (recovery.lost_node_checks). Its failure is no failed repair: it stays SUSPECT for a person.
    RECONNECT = "reconnect"
    # None either: an operator returned a SUSPECT or QUARANTINED node to service
    # (``gpu-recovery-admin return-node``); the same check as RECONNECT's (SUSPECT_CHECKS).
    OPERATOR = "operator"

    @property
    def words(self) -> str:
        return {"reboot": "its reboot", "gpu_reset": "its GPU reset",
                "replacement": "replacing a terminated node",
                "reconnect": "its ECS agent's reconnect",
                "operator": "an operator's return"}[self.value]


@dataclass(frozen=True)
class SuspectCheck:
    """The stack's own check of a node no repair preceded: the validation's task and claim on
    a node that stays SUSPECT meanwhile (``suspect_origin`` ``origin``), cordoned
    ``validating`` by the write that opens it (``domain.cordon.check_cordon``). A pass makes it
    AVAILABLE, its cordon cleared, as a passed validation; a failure is no failed repair: no
    node decision, it stays SUSPECT for a person (``failed_origin``) with the check's evidence
    and one e-mail, cordoned as known bad (``domain.cordon.failed_check_cordon``: its own
    verdict); a check that could not run loses its cordon (a missing answer holds no node)."""

    name: str  # what its verdict's source and the logs call it
    cause: str  # the cause its record names
    origin: str  # the node's suspect_origin while its check runs
    failed_origin: str  # ... once its check found a fault
    after: str  # what the check followed, in its failure's e-mail subject
    metric: str  # its metrics' prefix (<metric>Opened, <metric>Failed)


# Every repair kind that is such a check (``recovery.validations`` reads its failure from here).
SUSPECT_CHECKS: dict[Repair, SuspectCheck] = {
    Repair.RECONNECT: SuspectCheck("lost node's check", "builtin:ecs-agent-disconnected", LOST_NODE_ORIGIN,
                                   RECONNECT_CHECK_FAILED_ORIGIN, "after its ECS agent reconnected",
                                   "LostNodeChecks"),
    Repair.OPERATOR: SuspectCheck("operator's return check", "builtin:operator-return",
                                  OPERATOR_RETURN_ORIGIN, OPERATOR_CHECK_FAILED_ORIGIN,
                                  "an operator asked for on its return", "ReturnChecks"),
}


def suspect_check(validation: Mapping[str, Any]) -> SuspectCheck | None:
    """The check a node's ``validation`` is when no repair preceded it (None: a validation
    after repair)."""
    repair = str(validation.get("repair") or "")
    return next((check for kind, check in SUSPECT_CHECKS.items() if kind.value == repair), None)


class Result(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    NO_VERDICT = "no_verdict"  # the task did not run (image pull, OOM...) or was inconclusive: run it again


# The health check's verdict exit codes (DcgmVerdict): 0 healthy, 1 reboot, 2 replace,
# 3 operator action, 4 reset. Anything else is no verdict, its own inconclusive 5 included.
_VERDICT_EXITS = frozenset(verdict.value for verdict in DcgmVerdict)
# The cause a failure is counted under when the repair's own is unknown (a replacement node).
FALLBACK_CAUSE = "builtin:validation-failed"

DEFAULT_DCGM_LEVEL = 1
DEFAULT_LOAD_SECONDS = 30
DEFAULT_TIMEOUT_SECONDS = 10 * 60
MAX_LOAD_SECONDS = 3600
MAX_TIMEOUT_SECONDS = 4 * 3600
# A validation task that ends without a verdict is started again at most this many times.
START_RETRIES = 3
# A node the stack terminated in its Auto Scaling group is replaced by the group: the stack
# watches this long for a node of the group registering in the cluster, to validate it.
REPLACEMENT_WATCH_SECONDS = 3600
# How long each DCGM level takes (NVIDIA: level 1 seconds, 2 about 2 min, 3 about 15 min;
# level 4 longer still): the timeout must leave room for the level and the load.
LEVEL_SECONDS = {1: 30, 2: 150, 3: 1200, 4: 2700}


class ValidationError(ValueError):
    """A bad validation setting (its message names the key and what is allowed)."""


@dataclass(frozen=True)
class ValidationPolicy:
    """The deployment's validation after repair (context keys ``validate_after_repair``,
    ``validation_dcgm_level``, ``validation_load_seconds``, ``validation_timeout_minutes``)."""

    enabled: bool = False
    dcgm_level: int = DEFAULT_DCGM_LEVEL
    load_seconds: int = DEFAULT_LOAD_SECONDS
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        problems = []
        if self.dcgm_level not in LEVEL_SECONDS:
            problems.append(f"validation_dcgm_level must be 1..4, got {self.dcgm_level}")
        if not 0 <= self.load_seconds <= MAX_LOAD_SECONDS:
            problems.append(f"validation_load_seconds must be 0..{MAX_LOAD_SECONDS}, got {self.load_seconds}")
        if not 60 <= self.timeout_seconds <= MAX_TIMEOUT_SECONDS:
            problems.append(f"validation_timeout_minutes must be 1..{MAX_TIMEOUT_SECONDS // 60}, "
                            f"got {self.timeout_seconds / 60:g}")
        elif self.dcgm_level in LEVEL_SECONDS and self.timeout_seconds < self.expected_seconds:
            problems.append(f"validation_timeout_minutes ({self.timeout_seconds / 60:g}) leaves no room "
                            f"for a level-{self.dcgm_level} diag and {self.load_seconds} s of load (about "
                            f"{self.expected_seconds} s): raise it or shorten the validation")
        if problems:
            raise ValidationError("; ".join(problems))

    @property
    def expected_seconds(self) -> int:
        """About how long one validation runs (the diag's level and the load)."""
        return LEVEL_SECONDS.get(self.dcgm_level, 0) + self.load_seconds

    def describe(self) -> str:
        load = f" + {self.load_seconds} s GPU load" if self.load_seconds else " (no GPU load)"
        return f"DCGM diag level {self.dcgm_level}{load}"

    def task_environment(self, level: int | None = None, load_seconds: int | None = None) -> dict[str, str]:
        """The health-check container's environment for a validation (health_check/README.md):
        the level and load one validation recorded, else the policy's."""
        return {"DCGM_LEVEL": str(level or self.dcgm_level),
                "VALIDATION_LOAD_SECONDS": str(self.load_seconds if load_seconds is None else load_seconds)}

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> ValidationPolicy:
        """The functions' environment value (infra writes it from the context keys); "" is off."""
        text = raw.strip()
        if not text:
            return cls()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValidationError(f"validation settings must be a JSON object: {error.msg}") from error
        if not isinstance(data, dict):
            raise ValidationError("validation settings must be a JSON object")
        unknown = sorted(set(data) - {"enabled", "dcgm_level", "load_seconds", "timeout_seconds"})
        if unknown:
            raise ValidationError(f"unknown validation setting(s): {', '.join(unknown)}")
        try:
            return cls(enabled=_flag(data.get("enabled", False)),
                       dcgm_level=int(data.get("dcgm_level", DEFAULT_DCGM_LEVEL)),
                       load_seconds=int(data.get("load_seconds", DEFAULT_LOAD_SECONDS)),
                       timeout_seconds=int(data.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS)))
        except (TypeError, ValueError) as error:
            if isinstance(error, ValidationError):
                raise
            raise ValidationError(f"validation settings: {error}") from error


def _flag(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if str(value).strip().lower() in ("true", "false"):
        return str(value).strip().lower() == "true"
    raise ValidationError(f"validation 'enabled' must be true or false, got {value!r}")


def judge(exit_code: int | None) -> Result:
    """The validation task's exit code, by the health check's contract."""
    if exit_code == 0:
        return Result.PASSED
    if exit_code in _VERDICT_EXITS:
        return Result.FAILED
    return Result.NO_VERDICT


def task_time_up(*, until: float, created: float | None, started: float | None,
                 timeout_seconds: float) -> float:
    """When a validation task ECS still has pending or running at the validation's ``until``
    (which counts from the node's return) is out of time: ``timeout_seconds`` from when it
    began running, from its creation while it is still pending, so a task placed late (GPUs
    busy, a throttled or slow start, a slow image pull) gets a validation's whole time; never
    before ``until`` (nor later, when ECS gives neither time). Bounded: pending that long, or
    running that long, it is out of time."""
    begun = started if started is not None else created
    return until if begun is None else max(until, begun + timeout_seconds)


def started_by(node: str, since: float, attempt: int) -> str:
    """Deterministic per node, validation and start attempt (ECS startedBy: 36 characters at
    most): a claim whose StartTask answer was lost finds its task again by it."""
    return task_started_by.node_task(task_started_by.VALIDATION, node, repr(since), attempt)


def new_validation(repair: Repair, *, cause: str, since: float, policy: ValidationPolicy,
                   replaces: str = "") -> dict[str, Any]:
    """The instance item's ``validation`` once the node is back from ``repair`` (the intent)."""
    record: dict[str, Any] = {"repair": repair.value, "cause": cause or FALLBACK_CAUSE, "since": since,
                              "until": since + policy.timeout_seconds, "level": policy.dcgm_level,
                              "load_seconds": policy.load_seconds, "attempts": 0}
    if replaces:
        record["replaces"] = replaces
    return record


def replacement_watch(*, since: float, group: str) -> dict[str, Any]:
    """The terminated node's ``replacement_watch``: a node of ``group`` registering in the
    cluster from ``since`` on is its replacement, validated before it takes work."""
    return {"since": since, "until": since + REPLACEMENT_WATCH_SECONDS, "group": group}


def registered_since(since: float) -> str:
    """The cluster query language ``filter`` of the container instances registered at or
    after ``since`` (ECS: ``registeredAt`` takes ``2018-06-18T22:28:28Z``)."""
    stamp = datetime.fromtimestamp(int(since), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"registeredAt >= {stamp}"


def repair_cause(last_fault: Mapping[str, Any] | None) -> str:
    """The cause (catalog rule) of the decision whose repair is validated: a failure is
    counted under it, so a repair that does not hold climbs that cause's ladder."""
    plan = (last_fault or {}).get("plan") or {}
    decision = plan.get("decision") or {}
    return str(decision.get("rule_id") or FALLBACK_CAUSE)


def failure_decision(decision: Decision, repair: Repair) -> Decision:
    """The catalog's decision on a failed validation's evidence, always a node action: a
    verdict the catalog would answer without one (an override mapping it to an application
    error, say) still means the node did not pass, so it is rebooted (escalation decides
    from there)."""
    note = f"validation after {repair.words} failed"
    if decision.action in NODE_ACTIONS:
        return Decision(decision.action, decision.rule_id, f"{note}: {decision.reason}", Budget.NONE,
                        after_health_check=True, matched_rules=decision.matched_rules, notes=decision.notes)
    return Decision(Action.REBOOT, FALLBACK_CAUSE,
                    f"{note}; the catalog decided {decision.action.value} ({decision.reason}): reboot",
                    Budget.NONE, after_health_check=True, matched_rules=decision.matched_rules,
                    notes=decision.notes)


def result_record(outcome: Result, *, validation: Mapping[str, Any], now: float, exit_code: int | None,
                  task_arn: str = "", why: str = "") -> dict[str, Any]:
    """What the instance keeps of a validation (``last_validation``) and the jobs' history say."""
    since = float(validation.get("since") or now)
    record = {"result": outcome.value, "repair": validation.get("repair", ""), "since": since, "at": now,
              "seconds": round(max(0.0, now - since), 1), "level": validation.get("level"),
              "load_seconds": validation.get("load_seconds"), "exit_code": exit_code, "task_arn": task_arn}
    if why:
        record["why"] = why[:300]
    return record


def email_clause(node: str, record: Mapping[str, Any]) -> str:
    """The restart e-mail's "what was done" clause of a node the job waited for."""
    repair = Repair(str(record.get("repair") or "reboot")).words
    if record.get("result") == "off":
        return f"{node} not validated after {repair} (validate_after_repair is false)"
    load = record.get("load_seconds")
    what = f"DCGM level {record.get('level')}" + (f" + {load} s GPU load" if load else "")
    return f"validated {node} after {repair} ({what}): passed in {record.get('seconds', 0):g} s"


def history_note(node: str, record: Mapping[str, Any]) -> str:
    """One line for a job's history (and its restart e-mail) about its node's validation."""
    if record.get("result") == "off":
        return (f"{node} restarted without validation after {Repair(record.get('repair', 'reboot')).words} "
                "(validate_after_repair is false)")
    level, load = record.get("level"), record.get("load_seconds")
    what = f"DCGM level {level}" + (f" + {load} s GPU load" if load else "")
    repair = Repair(str(record.get("repair") or "reboot")).words
    if record.get("result") == Result.PASSED.value:
        return f"{node} passed its validation after {repair} ({what}) in {record.get('seconds', 0):g} s"
    why = f": {record['why']}" if record.get("why") else ""
    return f"{node} failed its validation after {repair} ({what}){why}"
