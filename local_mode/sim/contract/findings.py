"""The vocabulary of the request checks: what a check finds (the member, its value, the rule
it breaks), a limit stated in an API reference's prose, and the emulated state a stateful
limit reads."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Finding:
    member: str  # the member's path in the request ("tags[3].value")
    value: Any
    rule: str  # the limit it breaks, in words
    #: (error code, message) when the limit depends on state the stack does not own: the
    #: emulator answers AWS's refusal (the code must handle it) instead of failing the run
    answer: tuple[str, str] | None = None
    source: str = ""  # where the rule comes from, when not the limit's citation (a model's shape)


class RequestState(Protocol):
    """What a stateful limit reads of the emulated account (the moto world's backend or the
    scale world's control plane)."""

    def custom_attributes(self, cluster: str | None, target: str) -> Mapping[str, Any] | None:
        """The custom (not ``ecs.``) attributes on a container instance; None: unknown."""

    def key_schema(self, table: str) -> tuple[str, str | None] | None:
        """A table's partition and sort key attribute names; None: unknown table."""


class NoState:
    """No emulated state: the stateful limits that need it are skipped."""

    def custom_attributes(self, cluster: str | None, target: str) -> Mapping[str, Any] | None:
        return None

    def key_schema(self, table: str) -> tuple[str, str | None] | None:
        return None


Check = Callable[[Mapping[str, Any], RequestState], Iterable[Finding]]


@dataclass(frozen=True)
class ProseLimit:
    operation: str  # "ecs:StartTask"
    member: str  # what it constrains
    rule: str  # the limit, in words
    citation: str  # the API reference page (and section) that states it
    check: Check
    stateful: bool = False  # reads the emulated account's state


# The checks every service's limits share.
def utf8_bytes(text: Any) -> int:
    return len(str(text).encode("utf-8"))


def too_many(member: str, items: Any, limit: int, what: str) -> Iterator[Finding]:
    if isinstance(items, list | tuple | dict) and len(items) > limit:
        yield Finding(member, f"{len(items)} {what}", f"at most {limit} {what}")


def out_of_range(member: str, value: Any, low: int, high: int) -> Iterator[Finding]:
    if isinstance(value, int) and not low <= value <= high:
        yield Finding(member, value, f"between {low} and {high}")
