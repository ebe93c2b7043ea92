"""Names, namespaces and parents from a request: body fields, headers, the end user's id (OpenAI's `user`,
Anthropic's `metadata.user_id`).

Contract: names are data, never paths: they are validated by the core and only ever used as store keys.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from kvstore.api import validate_name
from kvstore.errors import InvalidName

from .errors import BadRequest

NAME_FIELD = "cache_prompt_name"
PARENT_FIELD = "cache_prompt_parent"
NAME_HEADER = "X-KV-Name"
PARENT_HEADER = "X-KV-Parent"
NAMESPACE_HEADER = "X-KV-Namespace"
USER_FIELD = "user"  # OpenAI's end-user id: the name with --name-from-user
# Anthropic's Messages API: the end user's id is `metadata.user_id` (the same role as `user`).
METADATA_FIELD, METADATA_USER_KEY = "metadata", "user_id"


class BadName(BadRequest, ValueError):
    """A name, parent or namespace the core refuses (400); str() is the reason for the client."""


@dataclass(frozen=True)
class Naming:
    namespace: str = ""
    name: Optional[str] = None
    parent: Optional[str] = None

    @property
    def key(self) -> Optional[tuple[str, str]]:
        return (self.namespace, self.name) if self.name else None

    @property
    def parent_key(self) -> Optional[tuple[str, str]]:
        return (self.namespace, self.parent) if self.parent else None


def _validate(value: object, what: str) -> str:
    if not isinstance(value, str):
        raise BadName(f"{what} must be a string, not {type(value).__name__}")
    try:
        validate_name(value, "namespace" if what == "namespace" else "name")
    except InvalidName as e:
        raise BadName(f"{what}: {e}" if what not in ("name", "namespace") else str(e)) from None
    return value


def validate(name: object, what: str = "name") -> str:
    return _validate(name, what)


def naming_of(headers: Mapping[str, str], body: Optional[Mapping[str, Any]], *, namespace: str,
              name_from_user: bool = False) -> Naming:
    """Name (body field, then header, then `user` when enabled), parent (body, then header), in `namespace`
    (the caller's: `auth.Tenancy.caller`)."""
    body = body or {}
    ns = namespace
    name = body.get(NAME_FIELD)
    if name is None:
        name = headers.get(NAME_HEADER)
    if name is None and name_from_user:
        name = body.get(USER_FIELD)
    parent = body.get(PARENT_FIELD)
    if parent is None:
        parent = headers.get(PARENT_HEADER)
    if name is not None:
        _validate(name, "name")
    if parent is not None:
        _validate(parent, "parent")
    return Naming(ns, name or None, parent or None)


def with_messages_user(body: dict) -> dict:
    """A Messages API body as `naming_of` reads it: its `metadata.user_id` as the `user` (a `user` of the body's own
    wins, as in the balancer's rules)."""
    metadata = body.get(METADATA_FIELD)
    if USER_FIELD not in body and isinstance(metadata, dict) and metadata.get(METADATA_USER_KEY) is not None:
        return {**body, USER_FIELD: metadata[METADATA_USER_KEY]}
    return body


def strip_fields(body: dict) -> dict:
    """The body llama-server gets: our fields removed."""
    body.pop(NAME_FIELD, None)
    body.pop(PARENT_FIELD, None)
    return body
