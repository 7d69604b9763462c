"""Each Lambda handler imports only what it uses (issue 50: cold starts).

A new container of a function pays for every module its handler imports before its first
event: the API authorizers (one GetItem and an HMAC, 1,024 ranks starting to poll at once)
must load no recovery or queue service, a recovery function none of the queue's modules, a
queue function none of the recovery loop's. Structural, not timed: the times are the
benchmark's (``make bench BENCH=imports``, docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HANDLERS = ROOT / "lambdas" / "handlers"

#: one GetItem and an HMAC: no service, no event models (pydantic), no X-Ray SDK
AUTHORIZER = ("gpu_recovery.recovery", "gpu_recovery.queue", "gpu_recovery.events",
              "gpu_recovery.settings", "gpu_recovery.repository.recovery_loop", "pydantic",
              "aws_xray_sdk")
RECOVERY = ("gpu_recovery.queue", "gpu_recovery.heartbeat")
#: the heartbeat service calls the recovery loop only for a lost or hung node (built then)
HEARTBEAT = ("gpu_recovery.queue", "gpu_recovery.recovery")
#: the control API calls the recovery loop for a suspend or a preflight (built then)
QUEUE_API = ("gpu_recovery.recovery", "gpu_recovery.heartbeat")

#: per handler module, the modules (and their submodules) it must not load at import
MUST_NOT_LOAD: dict[str, tuple[str, ...]] = {
    "node_authorizer": AUTHORIZER,
    "job_control_authorizer": AUTHORIZER,
    "ecs_task_handler": RECOVERY,
    "dcgm_task_monitor": RECOVERY,
    "ecs_instance_monitor": RECOVERY,
    "recovery_sweep": RECOVERY,
    "gang_worker": RECOVERY,
    "tag_lookup_worker": RECOVERY,
    "heartbeat_sweep": HEARTBEAT,
    "node_api": HEARTBEAT,
    "jobs_api": QUEUE_API,
    "job_control_api": QUEUE_API,
    "queue_scheduler": ("gpu_recovery.heartbeat",),
}

# One interpreter loads what every handler needs (boto3, Powertools' logger and metrics),
# then forks once per authorizer: each child imports its handler into a fresh module table
# and reports what that import added. Then it loads the libraries the other handlers share
# (their rules name only the project's modules) and forks once per other handler. Faster
# than an interpreter per handler, and the same answer for what the rules name.
SHARED = ("boto3", "aws_lambda_powertools.logging", "aws_lambda_powertools.metrics")
LIBRARIES = ("pydantic", "aws_xray_sdk.core", "aws_lambda_powertools.tracing",
             "aws_lambda_powertools.utilities.parser", "aws_lambda_powertools.utilities.batch",
             "aws_lambda_powertools.event_handler", "aws_lambda_powertools.utilities.idempotency")
_PROBE = """
import importlib, json, os, sys
loaded = {}
for preload, names in json.loads(sys.argv[1]):
    for module in preload:
        importlib.import_module(module)
    before = set(sys.modules)
    children = []
    for name in names:  # all at once: the machine's cores share them
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read)
            try:
                importlib.import_module("handlers." + name)
                payload = sorted(set(sys.modules) - before)
            except BaseException as error:
                payload = {"error": repr(error)}
            with os.fdopen(write, "w") as out:
                out.write(json.dumps(payload))
            os._exit(0)
        os.close(write)
        children.append((name, pid, read))
    for name, pid, read in children:
        with os.fdopen(read) as answer:
            loaded[name] = json.loads(answer.read())
        os.waitpid(pid, 0)
print(json.dumps(loaded))
"""

def handler_modules() -> list[str]:
    return sorted(p.stem for p in HANDLERS.glob("*.py") if not p.name.startswith("_"))


def loaded_at_import(names: list[str]) -> dict[str, list[str]]:
    """Per handler, the modules its import loads beyond SHARED (the authorizers) or beyond
    SHARED and LIBRARIES (the others)."""
    env = {k: v for k, v in os.environ.items() if k != "LAMBDA_TASK_ROOT"}
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "lambdas"), str(ROOT)))
    plan = [(SHARED, [n for n in names if MUST_NOT_LOAD.get(n) is AUTHORIZER]),
            (LIBRARIES, [n for n in names if MUST_NOT_LOAD.get(n) is not AUTHORIZER])]
    done = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(plan)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded: dict[str, list[str]] = json.loads(done.stdout)
    return loaded


def forbidden(loaded: list[str], rules: tuple[str, ...]) -> list[str]:
    """The modules of ``loaded`` that a rule names (the module or one of its submodules)."""
    return sorted(m for m in loaded if any(m == rule or m.startswith(rule + ".") for rule in rules))


def test_every_handler_module_has_its_rules() -> None:
    """Given the handler modules of lambdas/handlers/
    When compared with MUST_NOT_LOAD
    Then each has its entry (a new handler states what it must not load) and none is stale."""
    assert set(handler_modules()) == set(MUST_NOT_LOAD)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the probe forks one child per handler")
def test_each_handler_loads_only_what_it_uses() -> None:
    """Given each handler module imported into a fresh module table
    When the modules its import loaded are listed
    Then none is one it must not load: the authorizers no recovery or queue service, no
    event models, no full settings and no X-Ray SDK; the recovery functions none of the
    queue's or the heartbeat's modules; the heartbeat and queue APIs none of the recovery
    loop's (built on first use, when a request needs it)."""
    names = handler_modules()
    loaded = loaded_at_import(names)
    errors = {name: loaded[name]["error"] for name in names if isinstance(loaded[name], dict)}
    assert not errors, errors
    wrong = {name: found for name in names if (found := forbidden(loaded[name], MUST_NOT_LOAD[name]))}
    assert not wrong, "handlers loading what they do not use at import:\n" + "\n".join(
        f"  {name}: {', '.join(found)}" for name, found in sorted(wrong.items()))


@pytest.mark.parametrize(("loaded", "found"), [
    (["gpu_recovery.recovery", "gpu_recovery.repository.base"], ["gpu_recovery.recovery"]),
    (["gpu_recovery.queue.access", "boto3"], ["gpu_recovery.queue.access"]),
    (["gpu_recovery.settings_base", "gpu_recovery.events_log"], []),
    (["aws_xray_sdk.core", "pydantic_core"], ["aws_xray_sdk.core"]),
])
def test_the_rule_names_a_module_and_its_submodules_only(loaded: list[str], found: list[str]) -> None:
    """Given module lists When held to the authorizers' rules Then a named module and its
    submodules are found, a module whose name merely starts the same way is not."""
    assert forbidden(loaded, AUTHORIZER) == found
