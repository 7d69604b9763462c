"""The boto3 resource faces of the store: ``dynamodb.Table(name)`` and ``dynamodb.meta.client``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from .values import _botocore_client


class Service(Protocol):
    def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]: ...


class _Meta:
    def __init__(self, client: MemoryDynamoClient) -> None:
        self.client = client


class MemoryTable:
    """``dynamodb.Table(name)``: the table operations with ``TableName`` filled in."""

    def __init__(self, service: Service, name: str) -> None:
        self._service = service
        self.name = name
        self.table_name = name

    def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        return self._service.call(operation, {"TableName": self.name, **params})

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self._call("GetItem", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self._call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self._call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self._call("DeleteItem", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self._call("Query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self._call("Scan", params)


class MemoryDynamoClient:
    """``dynamodb.meta.client``: the resource's type-mapping client."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self.exceptions = _botocore_client().exceptions

    def get_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("GetItem", params)

    def put_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("PutItem", params)

    def update_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("UpdateItem", params)

    def delete_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("DeleteItem", params)

    def query(self, **params: Any) -> dict[str, Any]:
        return self._service.call("Query", params)

    def scan(self, **params: Any) -> dict[str, Any]:
        return self._service.call("Scan", params)

    def batch_get_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("BatchGetItem", params)

    def batch_write_item(self, **params: Any) -> dict[str, Any]:
        return self._service.call("BatchWriteItem", params)

    def transact_write_items(self, **params: Any) -> dict[str, Any]:
        return self._service.call("TransactWriteItems", params)
