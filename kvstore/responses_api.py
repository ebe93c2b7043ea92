"""OpenAI's Responses API (`POST /v1/responses`) as the chat request llama-server makes of it, to tokenize its prompt.

Contract: `chat_body(body)` is the part of the `/v1/chat/completions` body llama-server builds from a Responses
body (`server_chat_convert_responses_to_chatcmpl` in its server-chat.cpp) that its template reads
(`llama.TEMPLATE_FIELDS`), for the text subset agents and chat clients send: `instructions`; `input` as a string or
as items that are messages (`user`/`system`/`developer` with a string or `input_text` parts; `assistant`
`message`s with `output_text` parts, merged into the assistant message before them), `function_call`s and string
`function_call_output`s; function `tools`; `tool_choice` and `chat_template_kwargs` as given. Anything else
(images, files, reasoning items, refusals, an item llama-server would refuse) is None: the prompt's tokens are
then unknown, as for a chat request whose template cannot be applied, and the request is served without the
decisions that need them. Used only to tokenize: the request itself is forwarded to llama-server unchanged, so a
difference here can cost a restore, never change a reply. tests/hooks/test_hooks_client_apis.py compares the token
count with llama-server's own `/v1/responses/input_tokens`.
"""
from __future__ import annotations

import copy
from typing import Any, Optional

from kvstore.llama import TEMPLATE_FIELDS

_INPUT_ROLES = ("user", "system", "developer")


class _Unsupported(Exception):
    """An input the text subset does not cover."""


def _text_parts(content: Any, types: tuple[str, ...]) -> list[dict]:
    if isinstance(content, str):
        content = [{"type": "input_text", "text": content}]
    if not isinstance(content, list):
        raise _Unsupported("content")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") not in types or not isinstance(part.get("text"), str):
            raise _Unsupported("content part")
        parts.append({"text": part["text"], "type": "text"})
    return parts


def _as_message(item: dict, parts: list[dict]) -> dict:
    """A message item as a chat message: its fields but the item's `type` and `status`, with these content parts."""
    msg = {k: v for k, v in item.items() if k not in ("type", "status")}
    msg["content"] = parts
    return msg


def _messages(items: list) -> list[dict]:
    out: list[dict] = []
    for item in items:
        if not isinstance(item, dict):
            raise _Unsupported("item")
        merge_prev = bool(out) and out[-1].get("role") == "assistant"
        role, kind = item.get("role"), item.get("type")
        if role in _INPUT_ROLES and "content" in item:
            out.append(_as_message(item, _text_parts(item["content"], ("input_text",))))
        elif role == "assistant" and kind == "message":
            parts = _text_parts(item.get("content", []), ("output_text", "input_text"))
            if merge_prev:
                prev = out[-1]
                if not isinstance(prev.get("content"), list):
                    prev["content"] = []
                prev["content"].extend(parts)
            else:
                out.append(_as_message(item, parts))
        elif kind == "function_call" and all(isinstance(item.get(k), str) for k in ("arguments", "call_id", "name")):
            call = {"function": {"arguments": item["arguments"], "name": item["name"]}, "id": item["call_id"],
                    "type": "function"}
            if merge_prev:
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "tool_calls": [call]})
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str) \
                and isinstance(item.get("output"), str):
            out.append({"content": item["output"], "role": "tool", "tool_call_id": item["call_id"]})
        else:
            raise _Unsupported("item")
    return out


def _tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise _Unsupported("tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise _Unsupported("tool")
        if tool.get("type") != "function":
            continue  # llama-server skips them too (no chat equivalent)
        fn = {k: v for k, v in tool.items() if k != "type"}
        fn.setdefault("strict", True)
        out.append({"type": "function", "function": fn})
    return out


def chat_body(body: dict) -> Optional[dict]:
    """The template fields of the chat body llama-server evaluates for this Responses body, or None outside the
    text subset."""
    if "input" not in body or body.get("previous_response_id"):
        return None  # llama-server refuses both; its error reaches the client
    try:
        messages: list[dict] = []
        if "instructions" in body:
            if not isinstance(body["instructions"], str):
                return None
            messages.append({"role": "system", "content": body["instructions"]})
        given = body["input"]
        if isinstance(given, str):
            messages.append({"role": "user", "content": given})
        elif isinstance(given, list):
            messages.extend(_messages(copy.deepcopy(given)))
        else:
            return None
        # The other template fields pass through llama-server's conversion unchanged.
        chat = {k: body[k] for k in TEMPLATE_FIELDS if k in body and k not in ("messages", "tools")}
        chat["messages"] = messages
        if "tools" in body:
            tools = _tools(body["tools"])
            if tools:
                chat["tools"] = tools
        return chat
    except _Unsupported:
        return None
