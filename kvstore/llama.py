"""What kvstore knows about llama-server's HTTP API: paths, request shapes, reply fields, error bodies.

Contract: pure data in, data out: no transport, no I/O. The two clients are thin transports over it:
`kvstore.llama_client.LlamaServer` (sync; `kvstore.save`/`restore`, the CLI) and `kvstore.hooks.upstream.Upstream`
(async; the proxy), both on httpx. A change in llama-server's API is made here once.

Tokenizing: llama-server tokenizes a text prompt of `/completion` with `add_special` (BOS, when the model's
vocabulary asks for one) and `parse_special` (`<|im_start|>` is one token, not text). `tokenize_request(text)`
asks `/tokenize` for exactly that; `add_special=False` is for a piece that continues tokens already in the context.

Slot ids: llama-server maps `/slots/{id}` to `id % n_slots` and echoes the id it was asked for, so a wrong id
silently hits another slot; callers check ids against `n_slots(props)` first.
"""
from __future__ import annotations

import json
from typing import Any, Mapping, Optional

PROPS = "/props"
MODELS = "/v1/models"
SLOTS = "/slots"
HEALTH = "/health"
TOKENIZE = "/tokenize"
APPLY_TEMPLATE = "/apply-template"
LORA_ADAPTERS = "/lora-adapters"
COMPLETION = "/completion"
SLOT_ACTIONS = ("save", "restore", "erase")
# The headers llama-server reads an API key from, in order: `Authorization: Bearer KEY` (OpenAI's clients), else
# `X-Api-Key: KEY` (Anthropic's).
API_KEY_HEADERS = ("Authorization", "X-Api-Key")
# Fields of a chat request that /apply-template uses to render the prompt.
TEMPLATE_FIELDS = ("messages", "tools", "chat_template_kwargs", "tool_choice")


def slot_path(slot: int, action: str) -> str:
    """`POST /slots/{slot}?action=save|restore|erase`."""
    if action not in SLOT_ACTIONS:
        raise ValueError(f"unknown slot action {action!r}; one of {', '.join(SLOT_ACTIONS)}")
    return f"/slots/{slot}?action={action}"


def slot_body(filename: Optional[str]) -> dict:
    """The body of a slot action: `{"filename": ...}` for save/restore (a name inside --slot-save-path), `{}` for
    erase. Replies: save `{id_slot, filename, n_saved, n_written, timings.save_ms}`, restore `{id_slot, filename,
    n_restored, n_read, timings.restore_ms}` (a failed restore leaves the slot empty), erase `{id_slot, n_erased}`."""
    return {} if filename is None else {"filename": filename}


def tokenize_request(text: str, *, add_special: bool = True) -> dict:
    """The `/tokenize` body: by default the tokens llama-server evaluates for `text` as a `/completion` prompt."""
    return {"content": text, "add_special": add_special, "parse_special": True}


def api_key_of(headers: Mapping[str, str]) -> str:
    """The API key a request carries, as llama-server reads it ("" for none; a non-Bearer Authorization is none)."""
    auth = headers.get(API_KEY_HEADERS[0], "")
    if auth:
        return auth[7:].strip() if auth[:7].lower() == "bearer " else ""
    return headers.get(API_KEY_HEADERS[1], "").strip()


def tokens_of(reply: Any) -> list[int]:
    """The token ids of a `/tokenize` reply (plain ids, or `{"id", "piece"}` objects with `with_pieces`)."""
    doc = reply if isinstance(reply, dict) else {}
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in doc.get("tokens", [])]


def template_request(body: Mapping[str, Any], *, add_generation_prompt: Optional[bool] = None) -> dict:
    """The `/apply-template` body for a chat request; the reply's `prompt` (see `prompt_of`) is the rendered text."""
    req = {k: body[k] for k in TEMPLATE_FIELDS if k in body}
    if add_generation_prompt is not None:
        req["add_generation_prompt"] = add_generation_prompt
    return req


def prompt_of(reply: Any) -> str:
    return reply["prompt"]


def completion_request(prompt: Any, **params: Any) -> dict:
    """A `/completion` body: `prompt` is a string or a list of token ids."""
    return {"prompt": prompt, **params}


def n_slots(props: Mapping[str, Any]) -> int:
    """The slot count (`--parallel`) from `/props`; 0 when the server does not say."""
    return int(props.get("total_slots") or 0)


def n_ctx_slot(props: Mapping[str, Any]) -> int:
    """One slot's context size from `/props`; 0 when the server does not say."""
    return int((props.get("default_generation_settings") or {}).get("n_ctx") or 0)


def error_text(body: bytes) -> str:
    """The message of an error reply: llama-server sends `{"error": {"code", "message", "type"}}`; else raw text."""
    try:
        doc = json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace").strip()[:500]
    if isinstance(doc, dict):
        err = doc.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
    return json.dumps(doc)[:500]


def timings_of(reply: object) -> Optional[dict]:
    """A non-streamed reply's `timings`. llama-server's Responses and Messages API replies carry none, only `usage`:
    from it the prompt tokens evaluated and reused (`prompt_n`, `cache_n`; no times)."""
    if not isinstance(reply, dict):
        return None
    if isinstance(reply.get("timings"), dict):
        return reply["timings"]
    usage = reply.get("usage")
    if not isinstance(usage, dict):
        return None
    if isinstance(usage.get("input_tokens"), int) and isinstance(usage.get("cache_read_input_tokens"), int):
        # Anthropic's usage: input_tokens are those evaluated, besides the ones read from the cache
        return {"prompt_n": usage["input_tokens"], "cache_n": usage["cache_read_input_tokens"]}
    details = usage.get("input_tokens_details")
    if isinstance(details, dict) and isinstance(usage.get("input_tokens"), int) \
            and isinstance(details.get("cached_tokens"), int):
        return {"prompt_n": usage["input_tokens"] - details["cached_tokens"], "cache_n": details["cached_tokens"]}
    return None
