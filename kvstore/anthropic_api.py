"""Anthropic's Messages API (`POST /v1/messages`) served through llama-server's chat completions, in a chosen slot.

Contract: llama-server's own `/v1/messages` rebuilds the request from the fields it knows and drops `id_slot`, so
it runs in a slot of llama-server's choosing. kvstore makes the same rebuild itself and sends the result to
`/v1/chat/completions`, which honours `id_slot`:
- `chat_request(body)` is the chat body llama-server's `server_chat_convert_anthropic_to_oai` makes of a Messages
  body (same messages, tools, sampling fields; the Claude Code billing header's per-request stamp made constant),
  so the prompt, its tokens and the sampling are the ones llama-server's own endpoint would use. It raises
  `NotConvertible` (a ValueError whose message a client can act on) for a body with no conversation to convert.
- `reply_fields()` are the fields added to that chat body so its reply says what a Messages reply needs (the stop
  word, the prompt's cached/evaluated split before the first token).
- `Translation` turns the chat reply back into a Messages reply: one JSON message, or a stream of Messages events
  (`message_start`, content blocks one after another, `message_delta`, `message_stop`), shaped as llama-server's own
  endpoint answers (stop reasons `end_turn` / `max_tokens` / `tool_use`, the stop word in `stop_sequence`, usage
  with `cache_read_input_tokens`). Error replies pass as llama-server sent them: its `/v1/messages` answers errors
  in the same shape as chat. tests/hooks/test_hooks_client_apis.py compares both endpoints on the same requests.
Pure data in, data out: no transport.
"""
from __future__ import annotations

import json
from typing import Any, Optional


BILLING_HEADER = "x-anthropic-billing-header:"
# The header's `cch=xxxxx;` stamp changes with every request (an integrity hint, meaningless to a model): left as
# sent it would end every shared prefix at the first line of the system prompt. llama-server fills it with `f`s.
_STAMP_LEN = 5
DEFAULT_MAX_TOKENS = 4096  # llama-server's, when a body leaves out `max_tokens` (Anthropic requires it)
DEFAULT_THINKING_BUDGET = 10000
_PASSED = ("temperature", "top_p", "top_k", "stream", "chat_template_kwargs")  # as they are; the rest is dropped


class NotConvertible(ValueError):
    """A Messages body with no conversation to convert: the message says what is wrong."""


def _compact(doc: Any) -> str:
    """JSON as llama-server writes it (nlohmann's dump): no spaces, UTF-8 as it is."""
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _constant_stamp(text: str) -> str:
    if not text.startswith(BILLING_HEADER):
        return text
    at = text.find("cch=", len(BILLING_HEADER))
    end = at + 4 + _STAMP_LEN
    if at < 0 or end >= len(text) or text[end] != ";":
        return text
    return text[:at + 4] + "f" * _STAMP_LEN + text[end:]


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return _constant_stamp(system)
    if isinstance(system, list):
        return "".join(_constant_stamp(b.get("text", "")) for b in system
                       if isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text", ""), str))
    raise NotConvertible("`system` must be a string or a list of text blocks")


def _image_url(source: Any) -> Optional[str]:
    if not isinstance(source, dict):
        return None
    if source.get("type") == "base64":
        return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return None


def _tool_result(block: dict) -> dict:
    content = block.get("content")
    if isinstance(content, str):
        out: Any = content
    elif isinstance(content, list):
        parts: list[dict] = []
        has_image = False
        for c in content:
            if not isinstance(c, dict):
                continue
            if c.get("type") == "text":
                parts.append({"type": "text", "text": str(c.get("text", ""))})
            elif c.get("type") == "image":
                has_image = True
                url = _image_url(c.get("source"))
                if url is not None:
                    parts.append({"type": "image_url", "image_url": {"url": url}})
        # Text alone collapses to one string, as llama-server sends it to the template.
        out = parts if has_image else "".join(p["text"] for p in parts if p["type"] == "text")
    else:
        out = ""
    return {"role": "tool", "tool_call_id": str(block.get("tool_use_id", "")), "content": out}


def _message(msg: dict) -> list[dict]:
    """The chat messages of one Messages message: blocks to parts, tool uses to tool calls, tool results to tool
    messages after it, thinking to `reasoning_content`."""
    role, content = msg.get("role"), msg.get("content")
    role = role if isinstance(role, str) else ""  # as llama-server reads it
    if "content" not in msg:
        return [] if role == "assistant" else [msg]
    if not isinstance(content, list):
        return [msg]
    parts: list[dict] = []
    calls: list[dict] = []
    results: list[dict] = []
    reasoning = ""
    for block in content:
        if not isinstance(block, dict):
            raise NotConvertible(f"a content block of a {role!r} message is not an object")
        kind = block.get("type")
        if kind == "text":
            parts.append(block)
        elif kind == "thinking":
            reasoning += str(block.get("thinking", ""))
        elif kind == "image":
            url = _image_url(block.get("source"))
            if url is not None:
                parts.append({"type": "image_url", "image_url": {"url": url}})
        elif kind == "tool_use":
            calls.append({"id": str(block.get("id", "")), "type": "function",
                          "function": {"name": str(block.get("name", "")),
                                       "arguments": _compact(block.get("input", {}))}})
        elif kind == "tool_result":
            results.append(_tool_result(block))
    out = []
    if parts or calls or reasoning:
        converted: dict = {"role": role, "content": parts if parts else ""}
        if calls:
            converted["tool_calls"] = calls
        if reasoning:
            converted["reasoning_content"] = reasoning
        out.append(converted)
    return out + results


def _tools(tools: Any) -> list[dict]:
    if not isinstance(tools, list):
        raise NotConvertible("`tools` must be a list")
    out = []
    for tool in tools:
        if not isinstance(tool, dict):
            raise NotConvertible("a tool is not an object")
        out.append({"type": "function", "function": {"name": str(tool.get("name", "")),
                                                     "description": str(tool.get("description", "")),
                                                     "parameters": tool.get("input_schema", {})}})
    return out


def chat_request(body: dict) -> dict:
    """The chat completions body for a Messages body, as llama-server's own endpoint builds it."""
    if "messages" not in body:
        raise NotConvertible("`messages` is required")
    if not isinstance(body["messages"], list):
        raise NotConvertible("`messages` must be a list")
    messages: list[dict] = []
    if body.get("system") is not None:
        messages.append({"role": "system", "content": _system_text(body["system"])})
    for msg in body["messages"]:
        if not isinstance(msg, dict):
            raise NotConvertible("a message is not an object")
        messages.extend(_message(msg))
    chat: dict = {"messages": messages}
    if "tools" in body:
        chat["tools"] = _tools(body["tools"])
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        if choice.get("type") == "auto":
            chat["tool_choice"] = "auto"
        elif choice.get("type") in ("any", "tool"):
            chat["tool_choice"] = "required"
    if "stop_sequences" in body:
        chat["stop"] = body["stop_sequences"]
    chat["max_tokens"] = body.get("max_tokens", DEFAULT_MAX_TOKENS)
    chat.update({k: body[k] for k in _PASSED if k in body})
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "enabled":
        chat["thinking_budget_tokens"] = thinking.get("budget_tokens", DEFAULT_THINKING_BUDGET)
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and metadata.get("user_id"):
        chat["__metadata_user_id"] = str(metadata["user_id"])
    return chat


def reply_fields(stream: bool) -> dict:
    """Fields added to the chat body: the stop word (`__verbose.stopping_word`), and for a stream the prompt's
    cached/evaluated split before the first token (`prompt_progress`) and the usage chunk at the end."""
    fields: dict = {"verbose": True, "response_fields": ["stopping_word"]}
    if stream:
        fields.update({"return_progress": True, "stream_options": {"include_usage": True}})
    return fields


def stop_reason(finish_reason: Optional[str]) -> str:
    return {"stop": "end_turn", "tool_calls": "tool_use"}.get(finish_reason or "", "max_tokens")


def _stop_sequence(chunk: dict) -> Optional[str]:
    word = (chunk.get("__verbose") or {}).get("stopping_word")
    return word if isinstance(word, str) and word else None


def _usage(usage: Any) -> dict:
    usage = usage if isinstance(usage, dict) else {}
    prompt = int(usage.get("prompt_tokens") or 0)
    cached = int((usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)
    return {"cache_read_input_tokens": cached, "input_tokens": prompt - cached,
            "output_tokens": int(usage.get("completion_tokens") or 0)}


def _tool_use(call: dict) -> dict:
    fn = call.get("function") or {}
    try:
        arguments = json.loads(fn.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    return {"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""), "input": arguments}


def message_of(chat: dict) -> dict:
    """A non-streamed chat completion as a Messages reply."""
    choice = (chat.get("choices") or [{}])[0]
    msg = choice.get("message") or {}
    blocks: list[dict] = []
    if msg.get("reasoning_content"):
        blocks.append({"type": "thinking", "thinking": msg["reasoning_content"], "signature": ""})
    if msg.get("content"):
        blocks.append({"type": "text", "text": msg["content"]})
    blocks.extend(_tool_use(c) for c in msg.get("tool_calls") or [])
    return {"id": chat.get("id", ""), "type": "message", "role": "assistant", "content": blocks,
            "model": chat.get("model", ""), "stop_reason": stop_reason(choice.get("finish_reason")),
            "stop_sequence": _stop_sequence(chat), "usage": _usage(chat.get("usage"))}


def _event(kind: str, data: dict) -> bytes:
    return f"event: {kind}\ndata: {_compact({'type': kind, **data})}\n\n".encode()


class _Events:
    """A chat completion stream's chunks as Messages events: blocks opened one at a time, each closed before the
    next opens (thinking, text and each tool call in the order they come)."""

    def __init__(self) -> None:
        self.started = False
        self.progress: dict = {}
        self.block: Optional[tuple[str, int]] = None  # the open block: its kind ("thinking", "text", tool index)
        self.index = -1
        self.finish: Optional[str] = None
        self.stop_sequence: Optional[str] = None
        self.output_tokens = 0
        self.ended = False

    def _start(self, chunk: dict) -> bytes:
        self.started = True
        total, cached = int(self.progress.get("total") or 0), int(self.progress.get("cache") or 0)
        return _event("message_start", {"message": {
            "id": chunk.get("id", ""), "type": "message", "role": "assistant", "content": [],
            "model": chunk.get("model", ""), "stop_reason": None, "stop_sequence": None,
            "usage": {"cache_read_input_tokens": cached, "input_tokens": total - cached, "output_tokens": 0}}})

    def _close(self) -> bytes:
        if self.block is None:
            return b""
        out = b""
        if self.block[0] == "thinking":  # Anthropic's clients expect a signature before a thinking block ends
            out += _event("content_block_delta", {"index": self.index,
                                                  "delta": {"type": "signature_delta", "signature": ""}})
        self.block = None
        return out + _event("content_block_stop", {"index": self.index})

    def _open(self, key: tuple[str, int], block: dict) -> bytes:
        if self.block == key:
            return b""
        out = self._close()
        self.block, self.index = key, self.index + 1
        return out + _event("content_block_start", {"index": self.index, "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return _event("content_block_delta", {"index": self.index, "delta": delta})

    def chunk(self, chunk: dict) -> bytes:
        if "error" in chunk:  # llama-server failed mid-stream
            err = chunk["error"] if isinstance(chunk["error"], dict) else {"message": str(chunk["error"])}
            return _event("error", {"error": {"type": err.get("type", "api_error"),
                                              "message": err.get("message", "")}})
        if isinstance(chunk.get("prompt_progress"), dict):
            self.progress = chunk["prompt_progress"]
            return b""
        out = b"" if self.started else self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self.output_tokens = _usage(chunk["usage"])["output_tokens"]
        self.stop_sequence = self.stop_sequence or _stop_sequence(chunk)
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning_content"):
                out += self._open(("thinking", 0), {"type": "thinking", "thinking": ""})
                out += self._delta({"type": "thinking_delta", "thinking": delta["reasoning_content"]})
            if delta.get("content"):
                out += self._open(("text", 0), {"type": "text", "text": ""})
                out += self._delta({"type": "text_delta", "text": delta["content"]})
            for call in delta.get("tool_calls") or []:
                fn = call.get("function") or {}
                out += self._open(("tool", int(call.get("index") or 0)),
                                  {"type": "tool_use", "id": call.get("id", ""), "name": fn.get("name", ""),
                                   "input": {}})
                if fn.get("arguments"):
                    out += self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]})
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
        return out

    def end(self) -> bytes:
        """The closing events, once llama-server has said why it stopped (a cut stream ends without them)."""
        if self.finish is None or self.ended:
            return b""
        self.ended = True
        return self._close() + _event("message_delta", {
            "delta": {"stop_reason": stop_reason(self.finish), "stop_sequence": self.stop_sequence},
            "usage": {"output_tokens": self.output_tokens}}) + _event("message_stop", {})


class Translation:
    """One reply of `/v1/chat/completions` turned into the Messages reply, chunk by chunk (`upstream.forward`)."""

    def __init__(self, stream: bool):
        self.stream = stream
        self.buf = bytearray()
        self.events = _Events()

    def begin(self, status: int) -> Optional[str]:
        """The content type of the translated reply, or None to pass an error reply as llama-server sent it."""
        if status >= 400:
            return None
        return "text/event-stream" if self.stream else "application/json"

    def feed(self, chunk: bytes) -> bytes:
        self.buf += chunk
        if not self.stream:
            return b""  # one JSON document: translated whole at the end
        out = b""
        while True:
            cut = self.buf.find(b"\n")
            if cut < 0:
                return out
            line = bytes(self.buf[:cut]).strip()
            del self.buf[:cut + 1]
            out += self._line(line)

    def _line(self, line: bytes) -> bytes:
        if line.startswith(b":"):  # an SSE comment llama-server sends to keep the connection open
            return _event("ping", {})
        if not line.startswith(b"data:"):
            return b""
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return self.events.end()
        try:
            chunk = json.loads(payload)
        except ValueError:
            return b""
        return self.events.chunk(chunk) if isinstance(chunk, dict) else b""

    def finish(self) -> bytes:
        if self.stream:
            return self._line(bytes(self.buf).strip()) + self.events.end()
        try:
            chat = json.loads(bytes(self.buf))
        except ValueError:
            return bytes(self.buf)  # not JSON: passed on as it came
        return _compact(message_of(chat)).encode() if isinstance(chat, dict) else bytes(self.buf)
