"""The JobSpec a ``submit`` sends: a spec file (YAML or JSON), then the flags on top."""

from __future__ import annotations

import argparse
import re
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from cli.gpujobs.constants import AUTO_PRIORITY, PRIORITIES
from cli.gpujobs.errors import CliError


def _kv_pairs(items: list[str] | None, what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--{what} expects KEY=VALUE, got {item!r}", field=what)
        out[key] = value
    return out


def _str_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _str_map(value: Any, field: str) -> dict[str, str]:
    """A {K: V} map from a dict, a list of "K=V" or a list of {"name", "value"} (ECS style)."""
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): _str_value(v) for k, v in value.items()}
    if isinstance(value, list):
        out: dict[str, str] = {}
        for item in value:
            if isinstance(item, Mapping) and "name" in item:
                out[str(item["name"])] = _str_value(item.get("value"))
            elif isinstance(item, str) and "=" in item:
                k, _, v = item.partition("=")
                out[k] = v
            else:
                raise CliError(f"{field}: expected a map or a list of KEY=VALUE, got {item!r}", field=field)
        return out
    raise CliError(f"{field}: expected a map of KEY: VALUE", field=field)


def _command(value: Any, field: str = "command") -> list[str]:
    """A command list from a spec file: a list as is, a string shell-split."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    if isinstance(value, list):
        return [_str_value(v) for v in value]
    raise CliError(f"{field}: expected a list of strings or a string", field=field)


def _command_flags(values: list[str]) -> list[str]:
    """``--command``: one argument per flag, or a single flag holding a shell-quoted string."""
    if len(values) == 1:
        return shlex.split(values[0])
    return list(values)


def normalize_priority(value: Any) -> int | str:
    if isinstance(value, bool):
        raise CliError(f"invalid priority {value!r}", field="priority")
    if isinstance(value, int):
        return value
    text = str(value).strip()
    if re.fullmatch(r"[+-]?\d+", text):
        return int(text)
    name = text.upper().replace("-", "_").replace(" ", "_")
    if name not in PRIORITIES and name != AUTO_PRIORITY:
        raise CliError(f"invalid priority {value!r}: an integer, one of {', '.join(PRIORITIES)}, "
                       f"or {AUTO_PRIORITY}", field="priority")
    return name


def load_spec_file(path: str) -> dict[str, Any]:
    """Read a JobSpec from YAML or JSON (``-`` = stdin)."""
    import yaml

    try:
        if path == "-":
            text = sys.stdin.read()
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}") from exc
    try:
        doc = yaml.safe_load(text)  # JSON is YAML
    except yaml.YAMLError as exc:
        raise CliError(f"{path}: not valid YAML/JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise CliError(f"{path}: expected a mapping (a JobSpec), got {type(doc).__name__}")
    return doc


def build_spec(args: argparse.Namespace) -> dict[str, Any]:
    """The JobSpec body: the spec file (if any), then the flags on top."""
    spec: dict[str, Any] = load_spec_file(args.file) if args.file else {}
    # Accept "task-definition" style keys and top-level command/environment in spec files.
    spec = {str(k).replace("-", "_"): v for k, v in spec.items()}
    overrides = dict(spec.pop("overrides", None) or {})
    for key in ("command", "environment"):
        if key in spec:
            overrides.setdefault(key, spec.pop(key))
    if "env" in spec:
        overrides.setdefault("environment", spec.pop("env"))

    for flag, key in (("name", "name"), ("task_definition", "task_definition"),
                      ("container_name", "container_name"), ("nnodes", "nnodes"),
                      ("gpus_per_node", "gpus_per_node"),
                      ("max_recovery_attempts", "max_recovery_attempts"),
                      ("max_infra_recoveries", "max_infra_recoveries"),
                      ("max_app_restarts", "max_app_restarts"),
                      ("suspend_grace", "suspend_grace_seconds"), ("preflight", "preflight")):
        value = getattr(args, flag)
        if value is not None:
            spec[key] = value
    if args.priority is not None:
        spec["priority"] = args.priority
    if "command" in overrides:
        overrides["command"] = _command(overrides["command"], "overrides.command")
    if args.command:
        overrides["command"] = _command_flags(args.command)
    env = _str_map(overrides.get("environment"), "overrides.environment")
    env.update(_kv_pairs(args.env, "env"))
    if env or "environment" in overrides:
        overrides["environment"] = env
    labels = _str_map(spec.get("labels"), "labels")
    labels.update(_kv_pairs(args.label, "label"))
    if labels or "labels" in spec:
        spec["labels"] = labels
    if overrides:
        spec["overrides"] = overrides
    if "priority" in spec:
        spec["priority"] = normalize_priority(spec["priority"])
    for key in ("nnodes", "gpus_per_node", "max_recovery_attempts", "max_infra_recoveries",
                "max_app_restarts", "suspend_grace_seconds"):
        if key in spec and not isinstance(spec[key], int):
            try:
                spec[key] = int(spec[key])
            except (TypeError, ValueError):
                raise CliError(f"{key} must be an integer, got {spec[key]!r}", field=key) from None
    for key in ("name", "task_definition"):
        if not spec.get(key):
            flag = "--" + key.replace("_", "-")
            raise CliError(f"missing {key}: pass {flag} or set it in the spec file (-f)", field=key)
    return spec


def check_as_the_api_would(spec: dict[str, Any]) -> None:
    """``--dry-run``: refuse what the jobs API would, in its words, with its own validation
    (``gpu_recovery.queue.spec_errors``, installed with the project). The checks against the
    account (the task definition exists, the quota, the cluster's capacity) are the API's."""
    try:
        from gpu_recovery.queue.spec_errors import SpecError, validate_spec
    except ImportError as error:
        raise CliError(f"--dry-run validates with the jobs API's own model, which is not installed here "
                       f"({error}): run make install (or pip install -e .)") from None
    try:
        validate_spec(spec)
    except SpecError as error:
        raise CliError(f"the API would refuse this spec: {error.field}: {error.message}",
                       field=error.field) from None
