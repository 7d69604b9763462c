"""The jobs API bench runs on its own tables (it broke unseen when admission began reading
quotas and a cancel began taking an ECS call-budget token from the instance table)."""

from __future__ import annotations

from bench import jobs_api_bench


def test_one_round_of_every_route_answers_as_expected() -> None:
    """Given the bench's moto account
    When every route is timed once
    Then each answered with the status the bench expects (it raises otherwise) and has a figure."""
    report = jobs_api_bench.run(print_report=False, rounds=1)
    routes = report["routes"]
    assert "POST /v1/jobs/{job_id}/cancel (running)" in routes
    assert all(figures["median_ms"] > 0 for figures in routes.values())
