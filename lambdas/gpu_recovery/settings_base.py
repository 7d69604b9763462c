"""Reading the environment: the error that names a variable, the typed readers every
settings module shares, and the settings of the functions that read nothing else (the API
authorizers: a table name). Imports only the constants, so a function that reads its own
settings loads no other function's domain modules."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

from gpu_recovery import constants as c


class SettingsError(ValueError):
    """A missing or malformed environment variable; names the variable."""


def env_int(env: Mapping[str, str], name: str, default: int, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as error:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from error
    if value < minimum:
        raise SettingsError(f"{name} must be >= {minimum}, got {value}")
    return value


def env_bounded(env: Mapping[str, str], name: str, default: int, low: int, high: int) -> int:
    value = env_int(env, name, default, minimum=low)
    if value > high:
        raise SettingsError(f"{name} must be <= {high}, got {value}")
    return value


def env_bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw == "":
        return default
    if raw in ("true", "1", "yes"):
        return True
    if raw in ("false", "0", "no"):
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def env_required(env: Mapping[str, str], *names: str) -> None:
    missing = [name for name in names if not (env.get(name) or "").strip()]
    if missing:
        raise SettingsError(f"missing environment variables: {', '.join(missing)}")


def env_list(env: Mapping[str, str], name: str, default: tuple[str, ...]) -> tuple[str, ...]:
    raw = env.get(name)
    if raw is None or not raw.strip():
        return default
    text = raw.strip()
    try:
        values = json.loads(text) if text.startswith("[") else [v.strip() for v in text.split(",")]
    except ValueError as error:
        raise SettingsError(f"{name} must be a JSON list of strings, got {raw!r}") from error
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise SettingsError(f"{name} must be a JSON list of strings, got {raw!r}")
    return tuple(v for v in values if v)


def node_token_table(env: Mapping[str, str] | None = None) -> str:
    """The node-token table (node authorizer, admin CLI); the heartbeat service reads it
    from :func:`heartbeat_settings`."""
    env = os.environ if env is None else env
    return (env.get(c.ENV_NODE_TOKEN_TABLE) or "").strip() or c.DEFAULT_NODE_TOKEN_TABLE_NAME


def job_table(env: Mapping[str, str] | None = None) -> str:
    """The job table (the job-control authorizer reads a job's control secret from it)."""
    env = os.environ if env is None else env
    env_required(env, c.ENV_JOB_TABLE)
    return env[c.ENV_JOB_TABLE].strip()
