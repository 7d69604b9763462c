"""The node-token table (node API authorizer, admin CLI): apart from the heartbeat's records so
that the authorizer loads one small module, not the job table's repositories.

The token store (:mod:`gpu_recovery.heartbeat.tokens`) never touches DynamoDB itself.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import ClientError

from gpu_recovery.constants import NODE_TOKEN_PK
from gpu_recovery.repository.base import is_condition_failure


class NodeTokenRepository:
    """The node-token table: one item per node, the token's SHA-256 only."""

    def __init__(self, table: Any) -> None:
        self._table = table  # boto3 Table resource

    def get(self, node_id: str) -> dict[str, Any] | None:
        item = self._table.get_item(Key={NODE_TOKEN_PK: node_id}, ConsistentRead=True).get("Item")
        return dict(item) if item else None

    def put_active(self, node_id: str, fields: dict[str, Any]) -> None:
        """Create or rotate the node's token item (a rotation replaces it whole)."""
        self._table.put_item(Item={NODE_TOKEN_PK: node_id, **fields})

    def revoke(self, node_id: str, *, status_attr: str, hash_attr: str, status: str,
               revoked_at: int, revoked_by: str) -> bool:
        """Mark the item revoked and drop its hash; False if the node has no item."""
        try:
            self._table.update_item(
                Key={NODE_TOKEN_PK: node_id},
                UpdateExpression="SET #s = :r, revoked_at = :t, revoked_by = :b REMOVE #h",
                ConditionExpression="attribute_exists(#k)",
                ExpressionAttributeNames={"#s": status_attr, "#h": hash_attr, "#k": NODE_TOKEN_PK},
                ExpressionAttributeValues={":r": status, ":t": revoked_at, ":b": revoked_by},
            )
            return True
        except ClientError as error:
            if is_condition_failure(error):
                return False
            raise

    def all_items(self) -> list[dict[str, Any]]:
        """Every token item. Operator command only (gpu-recovery-admin list): a Scan,
        never on a request path; the deployed roles are not granted dynamodb:Scan."""
        items: list[dict[str, Any]] = []
        kwargs: dict[str, Any] = {}
        while True:
            page = self._table.scan(**kwargs)
            items.extend(dict(i) for i in page.get("Items", []))
            if "LastEvaluatedKey" not in page:
                return items
            kwargs["ExclusiveStartKey"] = page["LastEvaluatedKey"]
