"""The prose limits of the messaging services the stack calls (``prose_limits``' SNS and SQS
part): Publish's subject, message and attributes; SendMessage(Batch)'s bodies, delays and
attributes; ChangeMessageVisibilityBatch's entries and timeouts.

SQS messages are 256 KiB in the API references of the China partition (the stack
synthesizes for it), 1 MiB in the commercial one since 2025: the stricter figure is used.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import regex

from .findings import Finding, ProseLimit, RequestState, out_of_range, too_many, utf8_bytes

SNS_PUBLISH = "Amazon SNS API Reference, Publish"
SNS_ATTRIBUTES = "Amazon SNS Developer Guide, Amazon SNS message attributes"
SQS_BATCH = (
    "Amazon SQS API Reference, SendMessageBatch (docs.amazonaws.cn: 256 KiB; "
    "commercial partition 1 MiB since 2025)"
)
SQS_QUOTAS = "Amazon SQS Developer Guide, Amazon SQS message quotas"


# ================================================================================== SNS
SNS_MESSAGE_BYTES = 262_144
SNS_ATTRIBUTE_NAME = regex.compile(r"[A-Za-z0-9_.-]{1,256}")
SNS_DATA_TYPE = regex.compile(r"(String|String\.Array|Number|Binary)(\..+)?")


def _sns_subject(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    subject = params.get("Subject")
    if subject is None:
        return
    text = str(subject)
    if not text or len(text) >= 100:
        yield Finding("Subject", subject, "1 to 99 characters (less than 100)")
    if any(ord(c) < 0x20 or ord(c) > 0x7E for c in text):
        yield Finding(
            "Subject", subject, "printable ASCII only: no line breaks, control or non-ASCII characters"
        )


def _message_attributes(member: str, attributes: Mapping[str, Any] | None) -> Iterator[Finding]:
    for name, attribute in (attributes or {}).items():
        path = f"{member}[{name!r}]"
        if (
            not SNS_ATTRIBUTE_NAME.fullmatch(name)
            or name.startswith(".")
            or name.endswith(".")
            or ".." in name
            or name.lower().startswith(("aws.", "amazon."))
        ):
            yield Finding(
                path,
                name,
                "letters, digits, _ - . (not first, last or doubled), up to 256, "
                "not starting with AWS. or Amazon.",
            )
        data_type = str((attribute or {}).get("DataType", ""))
        if not SNS_DATA_TYPE.fullmatch(data_type) or utf8_bytes(data_type) > 256:
            yield Finding(
                f"{path}.DataType", data_type, "String, String.Array, Number or Binary (up to 256 bytes)"
            )
        if data_type.startswith(("String", "Number")) and not (attribute or {}).get("StringValue"):
            yield Finding(f"{path}.StringValue", (attribute or {}).get("StringValue"), "not empty")


def _attributes_bytes(attributes: Mapping[str, Any] | None) -> int:
    total = 0
    for name, attribute in (attributes or {}).items():
        attribute = attribute or {}
        total += utf8_bytes(name) + utf8_bytes(attribute.get("DataType", ""))
        value = attribute.get("StringValue")
        if value is None:
            value = attribute.get("BinaryValue") or b""
            total += len(value) if isinstance(value, bytes | bytearray) else utf8_bytes(value)
        else:
            total += utf8_bytes(value)
    return total


def _sns_message(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    message = params.get("Message")
    if message is not None and not str(message):
        yield Finding("Message", message, "not empty")
    attributes = params.get("MessageAttributes")
    yield from _message_attributes("MessageAttributes", attributes)
    size = utf8_bytes(message or "") + _attributes_bytes(attributes)
    if size > SNS_MESSAGE_BYTES:
        yield Finding(
            "Message",
            f"{size} bytes with its attributes",
            f"at most {SNS_MESSAGE_BYTES} bytes (256 KB), message attributes included",
        )


# ================================================================================== SQS
SQS_MESSAGE_BYTES = 262_144
SQS_BATCH_ID = regex.compile(r"[A-Za-z0-9_-]{1,80}")
SQS_BODY = regex.compile("[\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]*")


def _sqs_entry(path: str, entry: Mapping[str, Any]) -> Iterator[Finding]:
    body = entry.get("MessageBody")
    if body is not None and (not str(body) or not SQS_BODY.fullmatch(str(body))):
        yield Finding(
            f"{path}.MessageBody", body, "not empty; XML characters only (#x9 #xA #xD #x20-#xD7FF ...)"
        )
    yield from out_of_range(f"{path}.DelaySeconds", entry.get("DelaySeconds"), 0, 900)
    yield from too_many(
        f"{path}.MessageAttributes", entry.get("MessageAttributes"), 10, "message attributes"
    )
    yield from _message_attributes(f"{path}.MessageAttributes", entry.get("MessageAttributes"))


def _sqs_batch_ids(entries: list[Mapping[str, Any]]) -> Iterator[Finding]:
    """A ...Batch request's entries: up to 10, each Id of the pattern, none twice."""
    yield from too_many("Entries", entries, 10, "entries")
    ids: set[str] = set()
    for i, entry in enumerate(entries):
        entry_id = str(entry.get("Id", ""))
        if not SQS_BATCH_ID.fullmatch(entry_id):
            yield Finding(f"Entries[{i}].Id", entry_id, "up to 80 letters, digits, hyphens and underscores")
        if entry_id in ids:
            yield Finding(f"Entries[{i}].Id", entry_id, "unique within the batch")
        ids.add(entry_id)


def _sqs_batch(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    entries = list(params.get("Entries") or [])
    yield from _sqs_batch_ids(entries)
    total = 0
    for i, entry in enumerate(entries):
        yield from _sqs_entry(f"Entries[{i}]", entry)
        attributes = entry.get("MessageAttributes")
        total += utf8_bytes(entry.get("MessageBody") or "") + _attributes_bytes(attributes)
    if total > SQS_MESSAGE_BYTES:
        yield Finding("Entries", f"{total} bytes", f"at most {SQS_MESSAGE_BYTES} bytes (256 KiB) a batch")


def _sqs_send(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    yield from _sqs_entry("", params)
    size = utf8_bytes(params.get("MessageBody") or "") + _attributes_bytes(params.get("MessageAttributes"))
    if size > SQS_MESSAGE_BYTES:
        yield Finding("MessageBody", f"{size} bytes", f"at most {SQS_MESSAGE_BYTES} bytes (256 KiB)")


def _sqs_change_visibility_batch(params: Mapping[str, Any], _: RequestState) -> Iterator[Finding]:
    entries = list(params.get("Entries") or [])
    yield from _sqs_batch_ids(entries)
    for i, entry in enumerate(entries):
        yield from out_of_range(f"Entries[{i}].VisibilityTimeout", entry.get("VisibilityTimeout"), 0, 43_200)


LIMITS: tuple[ProseLimit, ...] = (
    ProseLimit(
        "sns:Publish",
        "Subject",
        "less than 100 characters, printable ASCII, no line breaks or control characters",
        f"{SNS_PUBLISH} (Subject); Amazon Managed Service for Prometheus User Guide, "
        "Understanding Amazon SNS message validation rules",
        _sns_subject,
    ),
    ProseLimit(
        "sns:Publish",
        "Message, MessageAttributes",
        "message not empty; at most 262,144 bytes with its "
        "attributes; attribute names, types and non-empty values",
        f"{SNS_PUBLISH} (Message); {SNS_ATTRIBUTES}",
        _sns_message,
    ),
    ProseLimit(
        "sqs:SendMessageBatch",
        "Entries",
        "up to 10 entries; Id up to 80 [A-Za-z0-9_-], unique; bodies "
        "not empty, XML characters, 262,144 bytes a batch; DelaySeconds 0-900; 10 attributes a message",
        f"{SQS_BATCH}; {SQS_QUOTAS}",
        _sqs_batch,
    ),
    ProseLimit(
        "sqs:ChangeMessageVisibilityBatch",
        "Entries",
        "up to 10 entries; Id up to 80 [A-Za-z0-9_-], unique; VisibilityTimeout 0-43,200 seconds",
        "Amazon SQS API Reference, ChangeMessageVisibilityBatch; ChangeMessageVisibility "
        f"(VisibilityTimeout); {SQS_QUOTAS}",
        _sqs_change_visibility_batch,
    ),
    ProseLimit(
        "sqs:SendMessage",
        "MessageBody",
        "not empty, XML characters, 262,144 bytes; DelaySeconds 0-900",
        "Amazon SQS API Reference, SendMessage; " + SQS_QUOTAS,
        _sqs_send,
    ),
)

OPERATIONS = {
    "sns:Publish": SNS_PUBLISH,
    "sqs:SendMessageBatch": "Amazon SQS API Reference, SendMessageBatch",
    "sqs:SendMessage": "Amazon SQS API Reference, SendMessage",
    "sqs:ChangeMessageVisibilityBatch": "Amazon SQS API Reference, ChangeMessageVisibilityBatch",
}
