"""The batch output: one JSON line per request, appended and fsynced one by one, so a run can be resumed.

Contract: a line is `{"id", "custom_id", "response": {"status_code", "request_id", "body"} | null, "error":
{"code", "message"} | null}` (OpenAI's batch output, as `vllm run-batch` writes it); for a line of Anthropic's
Message Batches input it is Anthropic's result line, `{"custom_id", "result": {"type": "succeeded", "message"} |
{"type": "errored", "error": {"type": "error", "error": {"type", "message"}}}}`. Each line is written with one
`write` of the whole line to a file opened with O_APPEND, then fsynced: a kill -9 leaves every line whole or
absent. `Output.open(path)` keeps the lines of requests that were answered (status 200, or `succeeded`) and drops
the rest (a torn last line, errors, replies that were not 200: they run again), so after a resumed run every
`custom_id` has exactly one line; `done` holds the ids that are not sent again.
"""
from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any, Optional

SUCCEEDED = "succeeded"
# kvstore's own error codes as Anthropic's error types (an unknown one: api_error).
_ANTHROPIC_TYPES = {"invalid_request": "invalid_request_error", "tokenize_failed": "invalid_request_error",
                    "connection_error": "api_error"}


def answered(doc: Any) -> bool:
    """Was this output line a successful answer (not run again on resume)?"""
    if not isinstance(doc, dict) or not isinstance(doc.get("custom_id"), str):
        return False
    if isinstance(doc.get("result"), dict):  # Anthropic's result line
        return doc["result"].get("type") == SUCCEEDED
    return (doc.get("error") is None and isinstance(doc.get("response"), dict)
            and doc["response"].get("status_code") == 200)


def _error_message(body: Any) -> str:
    """What a server's error reply says: llama-server's `{"error": {"message"}}`, else the body itself."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict) and body["error"].get("message"):
        return str(body["error"]["message"])
    return (body if isinstance(body, str) else json.dumps(body))[:500]


def record(custom_id: Optional[str], *, status: Optional[int] = None, body: Any = None,
           error: Optional[tuple[str, str]] = None, anthropic: bool = False) -> dict:
    """One output line: a server reply (`status`, `body`) or an error that kept the request from being answered;
    with `anthropic`, as Anthropic's Message Batches result."""
    if anthropic:
        if status == 200:
            return {"custom_id": custom_id, "result": {"type": SUCCEEDED, "message": body}}
        if error is not None:
            kind, message = _ANTHROPIC_TYPES.get(error[0], "api_error"), error[1]
        else:
            kind = "invalid_request_error" if status is not None and status < 500 else "api_error"
            message = _error_message(body)
        return {"custom_id": custom_id, "result": {"type": "errored", "error": {
            "type": "error", "error": {"type": kind, "message": message}}}}
    response = None if status is None else {"status_code": status, "request_id": uuid.uuid4().hex, "body": body}
    return {"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id, "response": response,
            "error": None if error is None else {"code": error[0], "message": error[1]}}


class Output:
    def __init__(self, path: Path, fd: int, done: set[str]):
        self.path, self._fd, self.done = path, fd, done

    @classmethod
    def open(cls, path: Path) -> "Output":
        path = Path(path)
        done: set[str] = set()
        if path.exists():
            keep: list[bytes] = []
            dropped = 0
            with open(path, "rb") as f:
                for raw in f:
                    try:
                        doc = json.loads(raw) if raw.endswith(b"\n") else None
                    except ValueError:
                        doc = None
                    if answered(doc) and doc["custom_id"] not in done:
                        done.add(doc["custom_id"])
                        keep.append(raw)
                    else:
                        dropped += 1
            if dropped:  # rewrite without them, atomically: the old file stays whole until the rename
                tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
                with open(tmp, "wb") as f:
                    f.writelines(keep)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, path)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return cls(path, fd, done)

    def write(self, line: dict) -> None:
        data = (json.dumps(line, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        n = os.write(self._fd, data)
        if n != len(data):  # a short write to a regular file means the disk is full: say so, never leave half
            raise OSError(f"{self.path}: short write ({n} of {len(data)} bytes); the disk may be full")
        os.fsync(self._fd)
        if answered(line):
            self.done.add(line["custom_id"])

    def close(self) -> None:
        os.close(self._fd)
