"""Observe-only mode: which side effects run and which are only recorded and notified.

``remediation_mode`` is ``enforce`` (default) or ``observe`` for everything, optionally with
per-effect exceptions, e.g. ``observe`` (a dry run, like NVSentinel's ``global.dryRun``) or
``enforce,reboot=observe,terminate=observe`` (act, but leave nodes alone). Parsed from the
setting's text by :func:`parse_remediation_mode`; the domain reads no environment.

Combinations the recovery loop cannot carry out are refused (:func:`combination_errors`):
every recovery starts by stopping the job's other ranks (the diag needs the node's GPUs,
a restart needs the old ranks gone, a node is only rebooted or drained once its job left
it), so ``stop_tasks=observe`` leaves every other effect observed too; and a node is
drained before it is terminated in its Auto Scaling group.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from gpu_recovery.domain.fault_vocabulary import Action


class Mode(str, Enum):
    ENFORCE = "enforce"
    OBSERVE = "observe"


class Effect(str, Enum):
    """A side effect the recovery loop can have on AWS."""

    STOP_TASKS = "stop_tasks"  # StopTask of the job's other ranks
    HEALTH_CHECK = "health_check"  # RunTask of the DCGM health check
    # Reset of the node's GPUs by a privileged task (issue 30's reset stage); no plan holds it
    # while RemediationPolicy.gpu_reset_enabled is False (reset_gpu is then carried out as a reboot).
    RESET_GPU = "reset_gpu"
    REBOOT = "reboot"
    DRAIN = "drain"  # quarantine: container instance to DRAINING
    TERMINATE = "terminate"  # TerminateInstanceInAutoScalingGroup (replace_action terminate_in_asg)
    RESTART_JOB = "restart_job"  # RunTask of the gang again (same or other nodes)


REPLACE_ACTIONS = ("quarantine", "terminate_in_asg")


def effects_of(action: Action, *, replace_action: str = "quarantine",
               quarantine_only: bool = False) -> tuple[Effect, ...]:
    """The side effects carrying out ``action`` takes, in order."""
    if replace_action not in REPLACE_ACTIONS:
        raise ValueError(f"replace_action must be one of {', '.join(REPLACE_ACTIONS)}, "
                         f"got {replace_action!r}")
    if action is Action.NONE:
        return ()
    if action in (Action.APPLICATION_ERROR, Action.RESTART_JOB):
        return (Effect.STOP_TASKS, Effect.RESTART_JOB)
    if action is Action.HEALTH_CHECK:
        return (Effect.STOP_TASKS, Effect.HEALTH_CHECK)
    if action is Action.OPERATOR_ACTION:
        return (Effect.STOP_TASKS, Effect.DRAIN)
    if action is Action.RESET_GPU:
        return (Effect.STOP_TASKS, Effect.RESET_GPU)
    if action is Action.REBOOT:
        return (Effect.STOP_TASKS, Effect.REBOOT)
    if replace_action == "terminate_in_asg" and not quarantine_only:
        return (Effect.STOP_TASKS, Effect.DRAIN, Effect.TERMINATE)
    return (Effect.STOP_TASKS, Effect.DRAIN)


@dataclass(frozen=True)
class RemediationModes:
    default: Mode = Mode.ENFORCE
    per_effect: Mapping[Effect, Mode] = field(default_factory=dict)

    def mode_for(self, effect: Effect) -> Mode:
        return self.per_effect.get(effect, self.default)

    def executes(self, effect: Effect) -> bool:
        """True: carry ``effect`` out. False: only record and notify what would have been done."""
        return self.mode_for(effect) is Mode.ENFORCE

    def split(self, effects: Iterable[Effect]) -> tuple[tuple[Effect, ...], tuple[Effect, ...]]:
        """(effects to carry out, effects to record only)."""
        effects = tuple(effects)
        return (tuple(e for e in effects if self.executes(e)),
                tuple(e for e in effects if not self.executes(e)))

    def describe(self) -> str:
        parts = [self.default.value] + [f"{e.value}={m.value}" for e, m in sorted(
            self.per_effect.items(), key=lambda kv: kv[0].value) if m is not self.default]
        return ",".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"default": self.default.value, **{e.value: m.value for e, m in self.per_effect.items()}}


# Effects that only follow a StopTask of the job's other ranks (see the module's docstring).
AFTER_STOP_TASKS = (Effect.HEALTH_CHECK, Effect.RESET_GPU, Effect.REBOOT, Effect.DRAIN, Effect.TERMINATE,
                    Effect.RESTART_JOB)


def combination_errors(modes: RemediationModes, *, replace_action: str = "quarantine",
                       setting: str = "remediation_mode") -> list[str]:
    """What cannot work together, each naming the setting and the fix (empty: fine)."""
    errors = []
    if not modes.executes(Effect.STOP_TASKS):
        enforced = [e.value for e in AFTER_STOP_TASKS if modes.executes(e)]
        if enforced:
            errors.append(
                f"{setting}: {', '.join(f'{e}=enforce' for e in enforced)} cannot happen with "
                "stop_tasks=observe (every recovery starts by stopping the job's other ranks: the "
                "DCGM diag needs the node's GPUs, a restart needs the old ranks gone, and a node "
                "is rebooted or drained only once its job left it); use 'observe' for everything, "
                "or set stop_tasks=enforce")
    if replace_action == "terminate_in_asg" and modes.executes(Effect.TERMINATE) \
            and not modes.executes(Effect.DRAIN):
        errors.append(f"{setting}: terminate=enforce needs drain=enforce with replace_action "
                      "terminate_in_asg (a node is drained before it is terminated in its Auto "
                      "Scaling group); add terminate=observe, or set drain=enforce")
    return errors


def _mode(value: Any, where: str) -> Mode:
    try:
        return Mode(str(value).strip().lower())
    except ValueError:
        raise ValueError(f"{where}: mode must be 'enforce' or 'observe', got {value!r}") from None


def _effect(name: Any, where: str) -> Effect:
    try:
        return Effect(str(name).strip().lower())
    except ValueError:
        allowed = ", ".join(e.value for e in Effect)
        raise ValueError(f"{where}: unknown effect {name!r} (allowed: {allowed})") from None


def parse_remediation_mode(text: str | None, *, setting: str = "remediation_mode") -> RemediationModes:
    """``"enforce"`` / ``"observe"`` / ``"enforce,reboot=observe"`` / JSON
    ``{"default": "observe", "stop_tasks": "enforce"}``. Empty means enforce.
    Raises ValueError naming ``setting`` and what to fix, also for a combination the
    recovery loop cannot carry out (``observe,health_check=enforce``); the one that
    depends on ``replace_action`` is checked by the settings parser."""
    raw = (text or "").strip()
    if not raw:
        return RemediationModes()
    if raw.startswith(("{", "[")):
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as error:
            raise ValueError(f"{setting}: not valid JSON ({error.msg})") from error
        if not isinstance(data, dict):
            raise ValueError(f"{setting}: JSON must be an object")
        default = _mode(data.get("default", Mode.ENFORCE.value), f"{setting}.default")
        per = {_effect(k, setting): _mode(v, f"{setting}.{k}") for k, v in data.items() if k != "default"}
        return _checked(RemediationModes(default, per), setting)
    default, per = Mode.ENFORCE, {}
    for position, part in enumerate(p.strip() for p in raw.split(",")):
        if not part:
            continue
        if "=" in part:
            name, value = part.split("=", 1)
            per[_effect(name, setting)] = _mode(value, f"{setting} {name.strip()}")
        elif position == 0:
            default = _mode(part, setting)
        else:
            raise ValueError(f"{setting}: {part!r} must be <effect>=<mode>; only the first item may "
                             "be a bare mode")
    return _checked(RemediationModes(default, per), setting)


def _checked(modes: RemediationModes, setting: str) -> RemediationModes:
    errors = combination_errors(modes, replace_action="quarantine", setting=setting)
    if errors:
        raise ValueError("; ".join(errors))
    return modes
