"""What a context key accepts: the parsers of the registry (``infra.config``).

A :class:`Parser` turns a raw context value (a string from ``-c key=value``, or a JSON
type from ``cdk.json``) into the typed value, or raises :class:`ConfigError` naming the
key; its ``accepts`` is the column of the configuration tables. Values a Lambda validates
again at run time (remediation settings, node quotas, the fault catalog) are checked here
by the functions' own parsers: one source of truth for their bounds.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpu_recovery.constants import ENV_DEFAULT_NODE_QUOTAS
from gpu_recovery.domain.fault_catalog import CatalogError, load_catalog
from gpu_recovery.domain.preflight.settings import parse_floors
from gpu_recovery.domain.relocation import SparePool
from gpu_recovery.domain.remediation_settings import parse_remediation_settings
from gpu_recovery.queue.access import NETWORK_EXAMPLE, parse_allowed_networks
from gpu_recovery.settings import SettingsError, parse_node_quotas
from infra.catalog_file import read_catalog_document

_TAG_KEY_RE = re.compile(r"^[\w.:/=+\-@ ]{1,128}$")
# CloudWatch Logs group names: 1-512 of [.-_/#A-Za-z0-9]; '*' allowed as an IAM wildcard.
_LOG_GROUP_RE = re.compile(r"^[.\-_/#A-Za-z0-9*]{1,512}$")
_TRUE = ("true", "1", "yes")
_FALSE = ("false", "0", "no")


class ConfigError(ValueError):
    """A context value is missing or invalid; the message names the key."""


Parse = Callable[[str, Any], Any]


@dataclass(frozen=True)
class Parser:
    """Turns a raw context value (never None or "") into the typed value, or raises
    ConfigError naming the key. ``accepts`` is shown in the configuration tables."""

    parse: Parse
    accepts: str = ""

    def __call__(self, key: str, value: Any) -> Any:
        return self.parse(key, value)


def text(pattern: re.Pattern[str], what: str, accepts: str = "") -> Parser:
    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str) or not pattern.match(value):
            raise ConfigError(f"context key {key!r} must be {what}, got {value!r}")
        return value

    return Parser(parse, accepts)


def choice(*values: str) -> Parser:
    def parse(key: str, value: Any) -> str:
        lowered = str(value).lower()
        if lowered not in values:
            options = " or ".join(repr(v) for v in values)
            raise ConfigError(f"context key {key!r} must be {options}, got {lowered!r}")
        return lowered

    return Parser(parse, " / ".join(f"`{v}`" for v in values))


def integer(low: int, high: int, *, zero_disables: bool = False) -> Parser:
    """An integer ``low..high`` (or 0 when ``zero_disables``)."""

    def parse(key: str, value: Any) -> int:
        hint = f"context key {key!r} must be an integer {low}..{high}, got {value!r}"
        if isinstance(value, bool):
            raise ConfigError(hint)
        if isinstance(value, str):
            if not re.fullmatch(r"[+-]?\d+", value):
                raise ConfigError(hint)
            value = int(value)
        if not isinstance(value, int):
            raise ConfigError(hint)
        if zero_disables and value == 0:
            return 0
        if not low <= value <= high:
            if zero_disables:
                raise ConfigError(f"context key {key!r} must be 0 (disabled) or between {low} "
                                  f"and {high}, got {value}")
            raise ConfigError(f"context key {key!r} must be between {low} and {high}, got {value}")
        return value

    return Parser(parse, f"0 or {low}..{high}" if zero_disables else f"{low}..{high}")


def number(low: float, high: float) -> Parser:
    def parse(key: str, value: Any) -> float:
        hint = f"context key {key!r} must be a number {low:g}..{high:g}, got {value!r}"
        if isinstance(value, bool):
            raise ConfigError(hint)
        if isinstance(value, str):
            if not re.fullmatch(r"[+-]?(\d+(\.\d*)?|\.\d+)", value):
                raise ConfigError(hint)
            value = float(value)
        if not isinstance(value, (int, float)) or not low <= value <= high:
            raise ConfigError(hint)
        return float(value)

    return Parser(parse, f"{low:g}..{high:g}")


def spare_count() -> Parser:
    """``spare_nodes``: a node count (``2``) or a percentage of the GPU nodes (``5%``)."""

    def parse(key: str, value: Any) -> str:
        try:
            return str(SparePool.parse(value))
        except ValueError as error:
            raise ConfigError(f"context key {key!r}: {error}") from error

    return Parser(parse, "count or %")


def boolean() -> Parser:
    def parse(key: str, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        lowered = str(value).strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"context key {key!r} must be true or false, got {value!r}")

    return Parser(parse, "bool")


def _list_items(key: str, value: Any, hint: str) -> list[Any]:
    """A JSON list (string or list) or a comma-separated string -> its items."""
    items: Any = value
    if isinstance(value, str):
        if value.startswith("["):
            try:
                items = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}") from exc
        else:
            items = [part.strip() for part in value.split(",")]
    if not isinstance(items, list):
        raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
    return items


def exit_codes() -> Parser:
    hint = "a JSON list or comma-separated list of exit codes 1..255, e.g. [1] or 1,134"

    def parse(key: str, value: Any) -> tuple[int, ...]:
        items = [value] if isinstance(value, int) and not isinstance(value, bool) else (
            _list_items(key, value, hint))
        codes: list[int] = []
        for item in items:
            if isinstance(item, str) and re.fullmatch(r"\d+", item):
                item = int(item)
            if isinstance(item, bool) or not isinstance(item, int) or not 1 <= item <= 255:
                raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
            if item not in codes:
                codes.append(item)
        if not codes:
            raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
        return tuple(codes)

    return Parser(parse, "list of 1..255")


def log_groups() -> Parser:
    hint = 'a JSON list or comma-separated list of log group names or patterns, e.g. ["/ecs/*"]'

    def parse(key: str, value: Any) -> tuple[str, ...]:
        groups: list[str] = []
        for item in _list_items(key, value, hint):
            # '*' or '/' alone would open every log group of the account: refused.
            if not isinstance(item, str) or not _LOG_GROUP_RE.match(item) or item.strip("*/") == "":
                raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
            if item not in groups:
                groups.append(item)
        if not groups:
            raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
        return tuple(groups)

    return Parser(parse, "list of names / patterns")


def names(pattern: re.Pattern[str], accepts: str) -> Parser:
    """A JSON list or comma-separated list of names matching ``pattern`` (may be empty)."""

    def parse(key: str, value: Any) -> tuple[str, ...]:
        hint = "a JSON list or comma-separated list of names"
        items = _list_items(key, value, hint)
        if not all(isinstance(i, str) for i in items):
            raise ConfigError(f"context key {key!r} must be {hint}, got {value!r}")
        entries = tuple(dict.fromkeys(i for i in items if i))
        for entry in entries:
            if not pattern.match(entry):
                raise ConfigError(f"context key {key!r}: {entry!r} is not a valid entry")
        return entries

    return Parser(parse, accepts)


def instance_tag_key(key: str, value: Any) -> str:
    tag = text(_TAG_KEY_RE, "a valid tag key (1-128 chars)")(key, value)
    if tag.lower().startswith("aws:"):
        raise ConfigError(f"context key {key!r} must not start with 'aws:'")
    return tag



def remediation_setting(accepts: str) -> Parser:
    """One remediation setting, validated by the domain's own parser; kept as its text."""

    def parse(key: str, value: Any) -> str:
        if isinstance(value, bool):
            value = "true" if value else "false"
        text_value = str(value).strip()
        try:
            parse_remediation_settings({key: text_value})
        except ValueError as error:
            message = str(error).removeprefix("remediation settings: ")
            raise ConfigError(f"context key {key!r}: {message}") from error
        return text_value

    return Parser(parse, accepts)


def resolve_catalog_path(value: str) -> Path:
    from infra import REPO_ROOT

    path = Path(value)
    return path if path.is_absolute() or path.exists() else REPO_ROOT / value


def catalog_file() -> Parser:
    """A fault-catalog override: merged onto the shipped catalog and validated now (synth)."""

    def parse(key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise ConfigError(f"context key {key!r} must be a path to a JSON or YAML file, got {value!r}")
        try:
            load_catalog(None, override=read_catalog_document(resolve_catalog_path(value)))
        except CatalogError as error:
            problems = "\n  ".join(error.errors)
            raise ConfigError(f"context key {key!r} ({value}): the fault catalog is invalid:\n  "
                              f"{problems}") from error
        return value

    return Parser(parse, "JSON / YAML path")


def node_quotas() -> Parser:
    """Default node quotas per priority level: a JSON object (text or, in cdk.json, an
    object), validated by the functions' own parser; kept as compact JSON text."""

    def parse(key: str, value: Any) -> str:
        text_value = value if isinstance(value, str) else json.dumps(value)
        try:
            parse_node_quotas(text_value)
            parsed = json.loads(text_value)
        except (SettingsError, ValueError) as error:
            # The functions' parser names their variable; here the key is what was given.
            message = str(error).removeprefix(ENV_DEFAULT_NODE_QUOTAS).lstrip(": ")
            raise ConfigError(f"context key {key!r}: {message} (e.g. {{\"HIGH\": 8, \"LOW\": 64}})"
                              ) from error
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"))

    return Parser(parse, "JSON {level: nodes}")


def task_networks() -> Parser:
    """The subnets and security groups a job's ``network`` may name: a JSON list of grants
    (text or, in cdk.json, a list), validated by the jobs API's own parser; kept as compact
    JSON."""

    def parse(key: str, value: Any) -> str:
        text_value = value if isinstance(value, str) else json.dumps(value)
        try:
            parse_allowed_networks(text_value)
            parsed = json.loads(text_value) if text_value.strip() else []
        except ValueError as error:
            message = str(error)
            if "e.g." not in message:
                message += f" (e.g. {NETWORK_EXAMPLE})"
            raise ConfigError(f"context key {key!r}: {message}") from error
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"))

    return Parser(parse, "JSON [{subnets, security_groups, principals?}]")


def preflight_floors() -> Parser:
    """Operator floors of the gang preflight, GB/s per node class: a JSON object (text or, in
    cdk.json, an object), validated by the functions' own parser; kept as compact JSON."""

    def parse(key: str, value: Any) -> str:
        text_value = value if isinstance(value, str) else json.dumps(value)
        try:
            parsed = json.loads(text_value)
            parse_floors(parsed)
        except ValueError as error:
            raise ConfigError(f"context key {key!r}: {error} (e.g. {{\"p5.48xlarge\": 250}})") from error
        return json.dumps(parsed, sort_keys=True, separators=(",", ":"))

    return Parser(parse, "JSON {instance type: GB/s}")

