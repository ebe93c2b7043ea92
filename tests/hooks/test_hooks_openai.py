"""The `openai` client works unchanged: chat, stream=True, the name by header or by extra_body."""
from __future__ import annotations

from openai import OpenAI

from hooks_support import engine, get, hooks, metric, stack


def test_openai_chat_stream_named(tmp_path):
    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store) as hk:
        client = OpenAI(base_url=hk.url + "/v1", api_key="sk-tenant-a", max_retries=0)
        msgs = [{"role": "system", "content": "You are a terse assistant. The user's name is Ada and she lives "
                                              "in Porto, a city famous for its bridges and its wine."},
                {"role": "user", "content": "Where do I live?"}]

        def chat(messages, **kw):
            raw = client.chat.completions.with_raw_response.create(
                model="m", messages=messages, max_tokens=6, temperature=0, stream=True, **kw)
            text, chunks = "", 0
            for chunk in raw.parse():
                chunks += 1
                if chunk.choices and chunk.choices[0].delta.content:
                    text += chunk.choices[0].delta.content
            return raw.headers, text, chunks

        h1, t1, n1 = chat(msgs, extra_headers={"X-KV-Name": "ada"})
        assert h1["X-KV-Cache"] == "miss" and n1 > 1 and t1
        msgs += [{"role": "assistant", "content": t1}, {"role": "user", "content": "And my name?"}]
        before = metric(hk.url, "kvstore_prompt_tokens_evaluated_total")
        h2, t2, _ = chat(msgs, extra_body={"cache_prompt_name": "ada"})
        assert h2["X-KV-Cache"] == "slot" and h2["X-KV-Slot"] == h1["X-KV-Slot"], dict(h2)
        evaluated = metric(hk.url, "kvstore_prompt_tokens_evaluated_total") - before
        assert 0 < evaluated < 40, evaluated  # the timings of the last SSE chunk were counted
        # The API key is the namespace: another key does not see "ada".
        listed = get(hk.url, "/kvstore/states", {"Authorization": "Bearer sk-other"}).json
        assert listed["namespace"].startswith("key-") and listed["states"] == []
        # The Responses API, as the client sends it: the conversation so far, named by extra_body.
        convo = [{"role": m["role"], "content": m["content"]} for m in msgs[:2]]
        r1 = client.responses.with_raw_response.create(model="m", input=convo, max_output_tokens=6, temperature=0,
                                                       extra_body={"cache_prompt_name": "ada-r"})
        t3 = r1.parse().output_text
        # (llama-server takes an assistant item only with "type": "message")
        convo += [{"type": "message", "role": "assistant", "content": t3}, {"role": "user", "content": "And my name?"}]
        r2 = client.responses.with_raw_response.create(model="m", input=convo, max_output_tokens=6, temperature=0,
                                                       extra_body={"cache_prompt_name": "ada-r"})
        usage = r2.parse().usage
        assert r1.headers["X-KV-Name"] == "ada-r" and r2.headers["X-KV-Cache"] == "slot", dict(r2.headers)
        assert usage.input_tokens - usage.input_tokens_details.cached_tokens < 40, usage
    print(f"\nopenai stream: {t1!r} then {t2!r}; second turn evaluated {evaluated:.0f} tokens")


def test_several_prompts_in_one_completion_run_in_flight_as_on_llama_server(tmp_path):
    """One completion with several prompts (the openai client's `prompt=[...]`, a batch runner's list): llama-server
    runs them in the slots it picks, in flight together; through kvstore each takes a slot as a request of its own
    (X-KV-Slot lists them: both slots serve), where one request would hold one slot and run them one by one. The
    replies are llama-server's own: the same texts in the prompts' order (usage summed over the prompts, as
    OpenAI's API counts). A named or streamed request with several prompts stays one request; a list llama-server
    cannot take is sent as it is, for llama-server to say why."""
    from hooks_support import intro, post

    store = tmp_path / "store"
    srv = engine("smollm2", store)
    prompts = [intro(i) + "Question: What is this person's job?\nAnswer:" for i in range(4)]
    with stack(srv), hooks(srv.url, store) as hk:
        base = {"prompt": prompts, "n_predict": 6, "temperature": 0}
        native = post(hk.url, "/completion", base)
        assert native.status == 200, native.body[:300]
        slots = native.headers["X-KV-Slot"].split(",")
        assert len(slots) == 4 and set(slots) == {"0", "1"}, slots
        assert [r["index"] for r in native.json] == [0, 1, 2, 3]
        client = OpenAI(base_url=hk.url + "/v1", api_key="unused", max_retries=0)
        raw = client.completions.with_raw_response.create(model="m", prompt=prompts, max_tokens=6, temperature=0)
        oai = raw.parse()
        assert set(raw.headers["X-KV-Slot"].split(",")) == {"0", "1"}
        assert [c.index for c in oai.choices] == [0, 1, 2, 3]
        assert oai.usage.prompt_tokens == sum(r["tokens_evaluated"] for r in native.json)

        one_request = [post(hk.url, "/completion", {**base, "cache_prompt_name": "batch"}),
                       post(hk.url, "/completion", {**base, "stream": True})]
        for r in one_request:
            assert r.status == 200 and "," not in r.headers["X-KV-Slot"], r.headers
        bad = post(hk.url, "/completion", {**base, "prompt": [["a", "b"], "c"]})
        assert bad.status == 400 and "prompt" in bad.json["error"]["message"], bad.body[:300]

        # llama-server's own answer to the same requests (its slots' content is no longer kvstore's concern here)
        own = post(srv.url, "/completion", {**base, "cache_prompt": False})
        assert [r["content"] for r in native.json] == [r["content"] for r in own.json]
        own = post(srv.url, "/v1/completions", {**base, "max_tokens": 6, "cache_prompt": False})
        assert [c.text for c in oai.choices] == [c["text"] for c in own.json["choices"]]


def test_a_long_list_of_prompts_does_not_fill_the_queue(tmp_path):
    """Twelve prompts in one request on a server whose queue holds one waiting request: they go at most one per
    slot at a time, so none is refused for a full queue (all twelve at once would leave nine 503s) and the reply
    holds all twelve, in order."""
    from hooks_support import post

    store = tmp_path / "store"
    srv = engine("smollm2", store)
    with stack(srv), hooks(srv.url, store, max_queue=1) as hk:
        prompts = [f"Count: {i}," for i in range(12)]
        r = post(hk.url, "/completion", {"prompt": prompts, "n_predict": 2, "temperature": 0})
        assert r.status == 200, r.body[:300]
        assert [x["index"] for x in r.json] == list(range(12))
        assert len(r.headers["X-KV-Slot"].split(",")) == 12
