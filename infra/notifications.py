"""Operator alerts: a KMS-encrypted SNS topic with an optional e-mail subscription."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct


class Notifications(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, alert_email: str | None) -> None:
        super().__init__(scope, construct_id)
        self.key = kms.Key(
            self,
            "TopicKey",
            description="GPU training recovery: encrypts the alert SNS topic",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.RETAIN,
        )
        # CloudWatch alarms publish to the encrypted topic.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowCloudWatchAlarmsToUseTheKey",
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey"],
                resources=["*"],
            )
        )
        self.topic = sns.Topic(
            self,
            "AlertTopic",
            display_name="GPU training recovery alerts",
            master_key=self.key,
            enforce_ssl=True,
        )
        if alert_email:
            self.topic.add_subscription(subscriptions.EmailSubscription(alert_email))

    def grant_publish(self, grantee: iam.IGrantable) -> None:
        """sns:Publish on this topic only, plus the two KMS actions SNS needs on its key."""
        iam.Grant.add_to_principal(
            grantee=grantee, actions=["sns:Publish"], resource_arns=[self.topic.topic_arn]
        )
        iam.Grant.add_to_principal(
            grantee=grantee,
            actions=["kms:Decrypt", "kms:GenerateDataKey"],
            resource_arns=[self.key.key_arn],
        )
