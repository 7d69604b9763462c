"""SNS notifier: one readable message per outcome, filterable by its kind."""

from __future__ import annotations

from typing import Any

from gpu_recovery.constants import NOTICE_ID_ATTRIBUTE, NOTIFICATION_KIND_ATTRIBUTE
from gpu_recovery.domain.notifications import Notification


class SnsNotifier:
    def __init__(self, sns_client: Any, topic_arn: str) -> None:
        self._sns = sns_client
        self._topic_arn = topic_arn

    def publish(self, notification: Notification) -> str:
        attributes = {
            NOTIFICATION_KIND_ATTRIBUTE: {"DataType": "String", "StringValue": notification.kind.value},
            NOTICE_ID_ATTRIBUTE: {"DataType": "String", "StringValue": notification.digest()},
        }
        for key, value in notification.attributes.items():
            attributes[key] = {"DataType": "String", "StringValue": value or "-"}
        response = self._sns.publish(
            TopicArn=self._topic_arn,
            Subject=notification.subject,
            Message=notification.published_body(),
            MessageAttributes=attributes,
        )
        return str(response.get("MessageId", ""))
