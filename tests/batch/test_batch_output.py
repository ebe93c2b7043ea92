"""The batch output file's resume rule (kvstore/batch/output.py) as plain logic: what a rerun keeps and sends again."""
from __future__ import annotations

import json

from kvstore.batch.output import Output, record


def test_resume_keeps_answers_once_and_drops_errors_and_a_torn_line(tmp_path):
    path = tmp_path / "out.jsonl"
    ok_a = record("a", status=200, body={"content": "x"})
    lines = [ok_a, record("b", status=503, body={"error": "busy"}), record(None, error=("invalid_request", "bad")),
             record("a", status=200, body={"content": "again"}), record("c", error=("connection_error", "refused"))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"id": "batch_req_torn", "custom_id": "d"')
    out = Output.open(path)
    assert out.done == {"a"}
    out.write(record("b", status=200, body={"content": "y"}))
    out.close()
    docs = [json.loads(x) for x in path.read_text().splitlines()]
    assert [d["custom_id"] for d in docs] == ["a", "b"] and docs[0] == ok_a
    assert Output.open(path).done == {"a", "b"}
    assert not list(tmp_path.glob(".*.tmp")), "the rewrite left no temp file"


def test_anthropic_result_lines_resume_as_openai_lines_do(tmp_path):
    """Lines of Anthropic's Message Batches input are answered with Anthropic's result lines: a reply with status
    200 `succeeded` (kept on resume), a server's error or kvstore's own `errored` with Anthropic's error types
    (sent again)."""
    path = tmp_path / "out.jsonl"
    ok = record("a", status=200, body={"type": "message", "content": []}, anthropic=True)
    assert ok == {"custom_id": "a", "result": {"type": "succeeded", "message": {"type": "message", "content": []}}}
    refused = record("b", status=400, body={"error": {"code": 400, "message": "too long"}}, anthropic=True)
    assert refused["result"] == {"type": "errored", "error": {
        "type": "error", "error": {"type": "invalid_request_error", "message": "too long"}}}
    down = record("c", error=("connection_error", "refused"), anthropic=True)
    assert down["result"]["error"]["error"] == {"type": "api_error", "message": "refused"}
    busy = record("d", status=503, body="upstream busy", anthropic=True)
    assert busy["result"]["error"]["error"] == {"type": "api_error", "message": "upstream busy"}
    path.write_text("".join(json.dumps(x) + "\n" for x in (ok, refused, down, busy)))
    out = Output.open(path)
    assert out.done == {"a"}
    out.write(record("b", status=200, body={"type": "message"}, anthropic=True))
    out.close()
    assert [json.loads(x)["custom_id"] for x in path.read_text().splitlines()] == ["a", "b"]
    assert Output.open(path).done == {"a", "b"}


def test_a_new_output_file_is_created(tmp_path):
    out = Output.open(tmp_path / "new.jsonl")
    assert out.done == set()
    out.write(record("x", status=400, body={"error": "no"}))
    out.close()
    assert Output.open(tmp_path / "new.jsonl").done == set(), "a 400 is not an answer: it runs again"


def test_retry_after_takes_seconds_or_a_date_and_is_bounded():
    """A 503's Retry-After as kvstore serve sends it (seconds) or as a proxy may (an HTTP-date); bad: the fallback."""
    import email.utils
    import time

    from kvstore.batch.runner import retry_after_s

    assert retry_after_s("1", 0.5) == 1.0
    assert retry_after_s("5", 0.5) == 5.0
    assert retry_after_s(None, 0.5) == 0.5
    assert retry_after_s("soon", 2.0) == 2.0
    assert retry_after_s("nan", 2.0) == 2.0
    assert retry_after_s("-3", 2.0) == 0.0
    assert retry_after_s("3600", 2.0) == 10.0, "a long wait is cut to the bound"
    in_4s = email.utils.formatdate(time.time() + 4, usegmt=True)
    assert 2.0 <= retry_after_s(in_4s, 0.5) <= 4.0
    assert retry_after_s(email.utils.formatdate(time.time() - 60, usegmt=True), 0.5) == 0.0, "a past date: now"
