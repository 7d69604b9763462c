"""The import-time bench (`make bench BENCH=imports`) measures what it says."""

from __future__ import annotations

from bench import imports_bench


def test_one_import_is_timed_in_a_fresh_interpreter_with_its_modules_counted() -> None:
    """Given the node API's authorizer When imported once by the bench Then its CPU and wall
    times are those of a real import (above zero, below a minute) and the count of gpu_recovery modules it
    loaded is small (no service: tests/handlers/test_cold_imports.py says which)."""
    cpu, wall, modules = imports_bench.import_once("node_authorizer")
    assert 0 < cpu < 60 and 0 < wall < 60
    assert 0 < modules < 40


def test_the_bench_covers_every_handler_with_its_goal() -> None:
    """Given the handler modules When the bench lists them Then the authorizers are held to
    0.5 s, the others to 1.2 s (issue 50)."""
    names = imports_bench.handler_names()
    assert {"node_authorizer", "job_control_authorizer", "ecs_task_handler", "jobs_api"} <= set(names)
    assert not any(name.startswith("_") for name in names)
    assert {imports_bench.goal_of(n) for n in imports_bench.AUTHORIZERS} == {0.5}
    assert imports_bench.goal_of("ecs_task_handler") == 1.2
