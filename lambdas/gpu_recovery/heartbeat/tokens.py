"""Node report tokens: ``<node_id>.<secret>``, stored only as a SHA-256 hash.

* The secret is ``secrets.token_urlsafe(32)`` (32 random bytes, no ``.`` in it), so the
  node id before the last ``.`` finds the item by key, never by a scan.
* The table keeps ``token_sha256`` = SHA-256 of the whole token (hex). A high-entropy
  random token needs no slow password hash; a table dump reveals no usable token.
* Verification compares hashes with :func:`hmac.compare_digest` (constant time).
* Revoking removes the hash and marks the item ``REVOKED``; issuing again rotates it.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpu_recovery import clock
from gpu_recovery.constants import NODE_TOKEN_PK
from gpu_recovery.repository.node_tokens import NodeTokenRepository

SECRET_BYTES = 32
NODE_ID_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_SECRET_RE = re.compile(r"^[A-Za-z0-9_-]{16,256}$")
MAX_TOKEN_LENGTH = 512
BEARER = "bearer"
HASH_ATTR = "token_sha256"
STATUS_ATTR = "token_status"
ACTIVE = "ACTIVE"
REVOKED = "REVOKED"


class TokenError(ValueError):
    """Bad node id or token text; the message says what is wrong."""


def validate_node_id(node_id: str) -> str:
    if not isinstance(node_id, str) or not NODE_ID_RE.match(node_id):
        raise TokenError(
            "node id must be 1-128 letters, digits, '-' or '_' (the ECS container instance id, "
            f"the last segment of its ARN), got {node_id!r}"
        )
    return node_id


def generate_secret() -> str:
    return secrets.token_urlsafe(SECRET_BYTES)


def format_token(node_id: str, secret: str) -> str:
    return f"{validate_node_id(node_id)}.{secret}"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """``<node_id>.<secret>`` -> (node_id, secret); None when it is not that shape."""
    if not isinstance(token, str) or not token or len(token) > MAX_TOKEN_LENGTH:
        return None
    node_id, sep, secret = token.rpartition(".")
    if not sep or not NODE_ID_RE.match(node_id) or not _SECRET_RE.match(secret):
        return None
    return node_id, secret


def token_from_authorization(header: str | None) -> str | None:
    """``Authorization: Bearer <token>`` -> token (scheme case-insensitive)."""
    if not header or len(header) > MAX_TOKEN_LENGTH + 16:
        return None
    scheme, _, value = header.strip().partition(" ")
    if scheme.lower() != BEARER:
        return None
    value = value.strip()
    return value or None


def hashes_match(token: str, stored_hash: str | None) -> bool:
    if not stored_hash:
        return False
    return hmac.compare_digest(hash_token(token).encode(), str(stored_hash).encode())


class Verdict(str, Enum):
    OK = "ok"
    MALFORMED = "malformed"  # no bearer token / not <node_id>.<secret>
    UNKNOWN = "unknown"  # no item for the node
    REVOKED = "revoked"
    MISMATCH = "mismatch"  # the node exists, the secret is wrong


@dataclass(frozen=True)
class Verification:
    verdict: Verdict
    node_id: str = ""

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


def verify_against_item(token: str, item: dict[str, Any] | None) -> Verification:
    """Pure: decide from the token and the node's table item (or None)."""
    parsed = parse_token(token)
    if parsed is None:
        return Verification(Verdict.MALFORMED)
    node_id, _ = parsed
    if item is None:
        return Verification(Verdict.UNKNOWN, node_id)
    if item.get(STATUS_ATTR) == REVOKED or not item.get(HASH_ATTR):
        return Verification(Verdict.REVOKED, node_id)
    if not hashes_match(token, item.get(HASH_ATTR)):
        return Verification(Verdict.MISMATCH, node_id)
    return Verification(Verdict.OK, node_id)


class TokenStore:
    """Issue, verify, revoke and list node tokens through :class:`NodeTokenRepository`.

    ``TokenStore(table)`` (a boto3 ``Table``) is accepted too: the store then builds the
    repository on it (the admin CLI and local mode pass the table).
    """

    def __init__(self, tokens: NodeTokenRepository | Any) -> None:
        self._tokens = tokens if isinstance(tokens, NodeTokenRepository) else NodeTokenRepository(tokens)

    def get(self, node_id: str) -> dict[str, Any] | None:
        return self._tokens.get(node_id)

    def verify(self, token: str | None) -> Verification:
        parsed = parse_token(token or "")
        if parsed is None:
            return Verification(Verdict.MALFORMED)
        return verify_against_item(token or "", self.get(parsed[0]))

    def issue(self, node_id: str, *, issued_by: str = "") -> str:
        """Create or rotate the node's token; returns it (shown once, never stored)."""
        validate_node_id(node_id)
        token = format_token(node_id, generate_secret())
        self._tokens.put_active(node_id, {
            HASH_ATTR: hash_token(token),
            STATUS_ATTR: ACTIVE,
            "issued_at": int(clock.now()),
            "issued_by": issued_by or "-",
            "hash_prefix": hash_token(token)[:8],  # to tell rotations apart in listings
        })
        return token

    def revoke(self, node_id: str, *, revoked_by: str = "") -> bool:
        """Mark revoked and drop the hash; False if the node never had a token."""
        validate_node_id(node_id)
        return self._tokens.revoke(node_id, status_attr=STATUS_ATTR, hash_attr=HASH_ATTR,
                                   status=REVOKED, revoked_at=int(clock.now()),
                                   revoked_by=revoked_by or "-")

    def list(self) -> list[dict[str, Any]]:
        """Every node's token metadata, hashes left out (operator command: a Scan is fine)."""
        items = [{k: v for k, v in item.items() if k != HASH_ATTR} for item in self._tokens.all_items()]
        return sorted(items, key=lambda i: str(i.get(NODE_TOKEN_PK)))
