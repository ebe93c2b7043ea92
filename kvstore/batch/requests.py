"""The batch input: OpenAI's Batch file format (or Anthropic's Message Batches requests), one request a line, read
as a stream.

Contract: `read(path)` yields one `Line` per input line, in order, holding only its byte offset and length in the
file (bodies are read again by offset when sent, so memory does not grow with the file), or the reason the line
cannot run. A line runs if it is a JSON object with a string `custom_id` not seen before, `"method": "POST"`, a
`url` of `URLS` and an object `body` with one prompt (`messages` for chat and Anthropic's Messages API, `input` for
OpenAI's Responses API, `prompt` as a string or token ids otherwise). A line of Anthropic's Message Batches
(`{"custom_id", "params"}`, no `url`) is a `/v1/messages` request whose body is `params`. Empty lines are skipped.
Nothing here talks to a server.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional

CHAT = "/v1/chat/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
URLS = (CHAT, RESPONSES, MESSAGES, "/v1/completions", "/completion")
PARAMS = "params"  # an Anthropic Message Batches line's request body


@dataclass
class Line:
    number: int  # 1-based line number in the input
    offset: int  # byte offset of the line in the input
    length: int
    custom_id: Optional[str] = None
    url: str = ""
    error: Optional[str] = None  # why the line cannot run (then it is answered with this error)
    anthropic: bool = False  # a line of Anthropic's Message Batches: answered with Anthropic's result line

    @property
    def chat(self) -> bool:
        return self.url == CHAT


def _body_key(doc: dict) -> str:
    """Where a line's request body is: `params` on an Anthropic Message Batches line (it has no `url`)."""
    return PARAMS if "url" not in doc and PARAMS in doc else "body"


def url_of(doc: dict) -> Any:
    """A line's endpoint: its `url`, or the Messages API for an Anthropic Message Batches line."""
    return MESSAGES if _body_key(doc) == PARAMS else doc.get("url")


def problem(doc: Any) -> Optional[str]:
    """Why a decoded line is not a request this command can send (None: it is)."""
    if not isinstance(doc, dict):
        return "the line is not a JSON object"
    cid = doc.get("custom_id")
    if not isinstance(cid, str) or not cid:
        return "missing `custom_id` (a non-empty string)"
    if doc.get("method", "POST") != "POST":
        return f"`method` must be POST, not {doc.get('method')!r}"
    url = url_of(doc)
    if url not in URLS:
        return f"unknown `url` {url!r}: one of {', '.join(URLS)}"
    key = _body_key(doc)
    body = doc.get(key)
    if not isinstance(body, dict):
        return f"`{key}` must be a JSON object"
    if url in (CHAT, MESSAGES):
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return "a chat or Messages request needs `messages` (a non-empty list)"
    elif url == RESPONSES:
        given = body.get("input")
        if not (isinstance(given, str) and given) and not (isinstance(given, list) and given):
            return "a Responses request needs `input` (a non-empty string or list of items)"
    else:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return None
        if not isinstance(prompt, str):
            return "`prompt` must be one string or one list of token ids (one prompt per line)"
    return None


def read(path: Path) -> Iterator[Line]:
    """Every line of the input, in order (see the module's contract); duplicate `custom_id`s are errors."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        number, offset = 0, 0
        for raw in f:
            number += 1
            line = Line(number, offset, len(raw))
            offset += len(raw)
            if not raw.strip():
                continue
            try:
                doc = json.loads(raw)
            except ValueError as e:
                line.error = f"line {number} is not JSON: {e}"
                yield line
                continue
            if isinstance(doc, dict) and isinstance(doc.get("custom_id"), str):
                line.custom_id = doc["custom_id"]
            line.anthropic = isinstance(doc, dict) and _body_key(doc) == PARAMS
            line.error = problem(doc)
            if line.error is None:
                line.url = url_of(doc)
                if line.custom_id in seen:
                    line.error = f"duplicate custom_id {line.custom_id!r} (first seen earlier in the file)"
                else:
                    seen.add(line.custom_id)  # type: ignore[arg-type]
            if line.error is not None:
                line.error = f"line {number}: {line.error}"
            yield line


def body_of(path: Path, line: Line) -> dict:
    """The request body of a line that runs, read again from the input."""
    with open(path, "rb") as f:
        f.seek(line.offset)
        doc = json.loads(f.read(line.length))
        return doc[_body_key(doc)]
