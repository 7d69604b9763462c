"""The demo's outcome table reads as the demo's result: a FAILED its scenario expects is
marked as expected, not as a failure of the demo (``make demo``'s whole run: test_demo.py,
slow tier)."""

from __future__ import annotations

from local_mode.demo import outcome_line


def test_an_expected_failure_reads_as_expected_and_a_surprise_as_a_problem() -> None:
    expected = outcome_line("resnet-sweep", "FAILED", "FAILED", 1, 0,
                            "health check healthy -> application error")
    assert expected.startswith("ok resnet-sweep    FAILED (as expected)")
    assert outcome_line("llama-ft", "COMPLETE", "COMPLETE", 2, 1, "recovered").startswith(
        "ok llama-ft        COMPLETE               attempt 2 recoveries 1")
    surprise = outcome_line("llama-ft", "FAILED", "COMPLETE", 2, 1, "recovered")
    assert surprise.startswith("!! llama-ft        FAILED (expected COMPLETE)")
