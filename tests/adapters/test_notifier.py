"""The SNS notifier (``adapters.notifier``): each e-mail names its notice, a repeat the same."""

from __future__ import annotations

from typing import Any

import botocore.session
from botocore.validate import validate_parameters

from gpu_recovery.adapters.notifier import SnsNotifier
from gpu_recovery.constants import NOTICE_ID_ATTRIBUTE, NOTIFICATION_KIND_ATTRIBUTE, NotificationKind
from gpu_recovery.domain.notifications import NotificationFacts, build

TOPIC = "arn:aws:sns:us-east-1:123456789012:gpu-recovery-alerts"
PUBLISH = botocore.session.get_session().get_service_model("sns").operation_model("Publish").input_shape


class _Sns:
    def __init__(self) -> None:
        self.published: list[dict[str, Any]] = []

    def publish(self, **params: Any) -> dict[str, Any]:
        validate_parameters(params, PUBLISH)  # raises on a request SNS would refuse
        self.published.append(params)
        return {"MessageId": str(len(self.published))}


def _notice(job: str) -> Any:
    return build(NotificationKind.RECOVERED, "Job recovered", NotificationFacts(
        job_id=job, container_inst_id="node-b", what_happened="a GPU fault", what_was_done="restarted",
        operator_action="nothing"))


def test_a_notice_sent_again_names_itself_the_same_and_another_notice_differently() -> None:
    """Given one notice published twice (its first Publish's answer lost: sent again) and another
    When the e-mails are read
    Then the repeat carries the first one's notice id, in its body and its message attribute, and
    the other notice another id."""
    sns = _Sns()
    notifier = SnsNotifier(sns, TOPIC)
    first, other = _notice("j1"), _notice("j2")
    for notification in (first, first, other):
        notifier.publish(notification)
    ids = [p["MessageAttributes"][NOTICE_ID_ATTRIBUTE]["StringValue"] for p in sns.published]
    assert ids[0] == ids[1] == first.digest() and ids[2] == other.digest() != ids[0]
    once, again, _ = (p["Message"] for p in sns.published)
    assert once == again and once.startswith(first.body)
    assert once.rstrip().endswith(f"Notice {first.digest()} (an e-mail with this id is a repeat of this one)")
    assert sns.published[0]["MessageAttributes"][NOTIFICATION_KIND_ATTRIBUTE]["StringValue"] == "recovered"
