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


def test_a_new_output_file_is_created(tmp_path):
    out = Output.open(tmp_path / "new.jsonl")
    assert out.done == set()
    out.write(record("x", status=400, body={"error": "no"}))
    out.close()
    assert Output.open(tmp_path / "new.jsonl").done == set(), "a 400 is not an answer: it runs again"
