"""The campaigns' e-mail bounds (``CampaignResult.mail_problems``): an e-mail is at least
once, so a notice whose confirmation was lost is sent again. A run that breaks one call allows
for one repeat; with calls failing at random, the repeats of one notice (by its notice id) are
not counted, its distinct notices are."""

from __future__ import annotations

from local_mode.campaigns.runner import CampaignResult

RECOVERED = ("recovered", "job-1")


def _result(mails: list[tuple[str, str]], resent: list[tuple[str, str]],
            failing: tuple[float, int] | None) -> CampaignResult:
    return CampaignResult(fault=None, fired=None, calls=[], stuck=[], dead_letters=0, mails=mails,
                          forgotten=[], failing=failing, resent=resent)


def test_one_notice_sent_three_times_is_one_e_mail_when_calls_fail_at_random() -> None:
    # seed 916 of app_error at 6 %: two lost Publish answers for one notice in a row
    result = _result([RECOVERED] * 3, [RECOVERED] * 2, failing=(0.06, 916))
    assert result.mail_problems({RECOVERED: (1, 2)}) == []


def test_a_run_that_breaks_one_call_counts_every_e_mail() -> None:
    result = _result([RECOVERED] * 3, [RECOVERED] * 2, failing=None)
    assert result.mail_problems({RECOVERED: (1, 2)}) == ["3 'recovered' e-mail(s) about job-1 (want 1..2)"]


def test_distinct_notices_are_counted_even_when_calls_fail() -> None:
    result = _result([RECOVERED] * 3, [], failing=(0.06, 1))
    assert result.mail_problems({RECOVERED: (1, 2)}) == ["3 'recovered' e-mail(s) about job-1 (want 1..2)"]
    assert result.mail_problems({RECOVERED: (0, 0)}) == ["3 'recovered' e-mail(s) about job-1 (want 0..0)"]


def test_an_e_mail_owed_and_never_sent_is_a_problem() -> None:
    result = _result([], [], failing=(0.06, 1))
    assert result.mail_problems({RECOVERED: (1, 2)}) == ["0 'recovered' e-mail(s) about job-1 (want 1..2)"]
