"""SSM's view of the simulated ECS Anywhere hosts (``mi-`` nodes): moto models no managed
instance, so the moto world answers for them here, from the data plane's nodes.

* **DescribeInstanceInformation** — each ``mi-`` node: ``PingStatus`` ``Online`` while its
  agent is connected (``ConnectionLost`` while it reboots, or when a test takes its SSM
  agent ``offline``), ``ResourceType`` ``ManagedInstance``, ``IPAddress`` (a private
  address of its own, stable per node), ``PlatformType`` Linux. The ``InstanceIds`` filter
  (the only one the stack and the doctor send) and paging (``MaxResults`` 5-50, default 50,
  ``NextToken``), as the AWS Systems Manager API Reference describes them. The queue
  scheduler reads rank 0's address here (MASTER_ADDR) when the node has no
  ``gpu-recovery.host-address`` attribute; the doctor reads the ping status.
* **ListTagsForResource** (``ResourceType=ManagedInstance``) — the node's tags, from moto's
  tag store, where the data plane puts them when the node registers (moto's
  AddTagsToResource refuses a managed instance); :meth:`ManagedInstances.set_tags`
  changes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..api_hooks import hook_answer
from ..emulator import LocalAws

#: DescribeInstanceInformation's page size without MaxResults
_DEFAULT_PAGE = 50


class ManagedInstances:
    """The ``mi-`` nodes as SSM describes them (see the module docstring)."""

    def __init__(self, local: LocalAws, nodes: Callable[[], Iterable[Any]]) -> None:
        self.local = local
        self._nodes = nodes
        #: managed instances whose SSM agent does not answer (a test's broken host)
        self.offline: set[str] = set()
        local.hooks.on_before_call("ssm", "DescribeInstanceInformation", self._describe)
        local.hooks.on_before_call("ssm", "ListTagsForResource", self._list_tags)

    def hosts(self) -> list[Any]:
        return [node for node in self._nodes() if node.kind == "anywhere"]

    @staticmethod
    def address(index: int) -> str:
        """The private address of the ``index``-th ``mi-`` host registered (10.64.0.0/16)."""
        return f"10.64.{index // 254}.{index % 254 + 1}"

    def set_tags(self, instance_id: str, tags: Mapping[str, str]) -> None:
        self._tag_store()[instance_id] = dict(tags)

    def _tag_store(self) -> dict[str, dict[str, str]]:
        from moto.ssm.models import ssm_backends

        store: dict[str, dict[str, str]] = ssm_backends[self.local.account_id][self.local.region] \
            ._resource_tags["ManagedInstance"]
        return store

    def _describe(self, params: dict[str, Any], context: Any) -> Any:
        wanted: set[str] | None = None
        for entry in params.get("Filters") or []:
            if entry.get("Key") == "InstanceIds":
                wanted = (wanted or set()) | set(entry.get("Values") or [])
        size = int(params.get("MaxResults") or _DEFAULT_PAGE)  # 5-50: the request guard holds it
        found = [self._info(index, node) for index, node in enumerate(self.hosts())
                 if wanted is None or node.instance_id in wanted]
        start = int(params.get("NextToken") or 0)
        page = found[start:start + size]
        answer: dict[str, Any] = {"InstanceInformationList": page}
        if start + size < len(found):
            answer["NextToken"] = str(start + size)
        return hook_answer("ssm", answer)

    def _info(self, index: int, node: Any) -> dict[str, Any]:
        online = node.agent_connected and node.instance_id not in self.offline
        return {"InstanceId": node.instance_id, "PingStatus": "Online" if online else "ConnectionLost",
                "ResourceType": "ManagedInstance", "IPAddress": self.address(index),
                "PlatformType": "Linux", "ComputerName": node.name}

    def _list_tags(self, params: dict[str, Any], context: Any) -> Any:
        if params.get("ResourceType") != "ManagedInstance":
            return None
        tags = self._tag_store().get(str(params.get("ResourceId")), {})
        return hook_answer("ssm", {"TagList": [{"Key": k, "Value": v} for k, v in tags.items()]})
