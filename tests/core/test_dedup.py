"""Parent + delta (architecture.md, use case 2): one article stored once, ten questions each restored from it;
every child stores only the bytes past the fork point."""
from __future__ import annotations

import pytest

from conftest import MODELS, complete, kv_row_bytes

import kvstore
from kvstore.llama_client import LlamaServer
from make_states import ARTICLE

QUESTIONS = [
    " Question: Who designed the lens? Answer:",
    " Question: Where did the Pharos stand? Answer:",
    " Question: How far could a Fresnel beam be seen? Answer:",
    " Question: What did keepers write in logbooks? Answer:",
    " Question: What replaced the keepers? Answer:",
    " Question: Why was rock station work dangerous? Answer:",
    " Question: How tall was the Pharos? Answer:",
    " Question: What lit medieval lighthouses? Answer:",
    " Question: What tells a ship its position today? Answer:",
    " Question: Why do lighthouses still shine? Answer:",
]


@pytest.mark.parametrize("served", MODELS, indirect=True)
def test_parent_and_ten_children(served, tmp_path, oracle):
    url, st = served.url, served.store
    ns = "dedup"
    srv = LlamaServer(url)
    article = srv.tokenize(ARTICLE, add_special=True)
    # prime slot 0 with the article only: with n_predict 1 the sampled token is not evaluated, so the slot
    # holds exactly the article (the state a question simply extends, also on SWA models)
    complete(url, article, 0, n_predict=1)
    rp = kvstore.save("article", 0, server=url, store=st, namespace=ns)
    assert rp["n_tokens"] == len(article)
    assert st.tokens("article", namespace=ns) == article

    parent_file = tmp_path / "parent.bin"
    st.materialize("article", str(parent_file), namespace=ns)
    prow = kv_row_bytes(oracle, parent_file)
    per_cell = prow["per_cell"]
    B = st.block_size
    assert per_cell > 0

    raw_total, stored_total = rp["file_bytes"], rp["new_stored_bytes"]
    per_child = []
    for i, q in enumerate(QUESTIONS):
        r = kvstore.restore("article", 0, server=url, store=st, namespace=ns)
        assert r["n_restored"] == len(article)
        qt = srv.tokenize(q, add_special=False)
        out = complete(url, article + qt, 0, n_predict=3)
        # the parent was used: only the question (and, on SWA models, the tail after the last checkpoint) is
        # evaluated
        assert out["timings"]["cache_n"] >= len(article) - 8, out["timings"]
        rc = kvstore.save(f"q{i}", 0, server=url, store=st, namespace=ns, parent="article")
        n_child = rc["n_tokens"]
        assert n_child >= len(article) + len(qt)
        assert st.tokens(f"q{i}", namespace=ns)[:len(article)] == article
        assert st.get(f"q{i}", namespace=ns)["parent"], "the parent is recorded"

        # Bound on the new bytes. Everything below the parent's last full block is shared (a child restored
        # from its parent carries the parent's bytes). New: the rows of the span from that block boundary to
        # the child's end (question + generated tokens + the parent's partial last block), plus the
        # skeleton and manifest (header, token list, 8 bytes of metadata per cell: small, bounded by
        # 64 KiB + 64 B per token).
        span = n_child - (len(article) // B) * B
        bound = span * per_cell + 65536 + 64 * n_child
        if served.model == "gemma3":
            # Gemma 3 (SWA): the child's SCKP appendix adds a checkpoint taken while the question was
            # evaluated (n_prompt - 4). Its SWA rows below the fork are the same bytes as the body's SWA
            # blocks (shared), but the rows of its own partial block at the checkpoint position are new,
            # and the copies of parent checkpoints are carried over unchanged. Allow one block of
            # B cells (both sections' row size, an over-estimate of the SWA-only rows) per new checkpoint.
            crow = kv_row_bytes(oracle, _materialize(st, f"q{i}", ns, tmp_path / f"q{i}.bin"))
            new_ckpts = max(0, crow["n_checkpoints"] - prow["n_checkpoints"])
            bound += new_ckpts * B * per_cell
        assert rc["new_raw_bytes"] <= bound, (served.model, i, rc, bound)
        assert rc["new_raw_bytes"] < rc["file_bytes"] / 3, (served.model, i, rc)
        raw_total += rc["file_bytes"]
        stored_total += rc["new_stored_bytes"]
        per_child.append((rc["file_bytes"], rc["new_raw_bytes"], rc["new_stored_bytes"]))

    assert not list(served.sync.iterdir()), "the sync directory is left empty"
    n = len(per_child)
    print(f"\n[parent+delta {served.model}] B={B} per-cell={per_cell} B/token, parent {rp['n_tokens']} tokens "
          f"{rp['file_bytes']} B raw -> {rp['new_stored_bytes']} B stored; children: "
          f"avg file {sum(c[0] for c in per_child) // n} B, avg new raw {sum(c[1] for c in per_child) // n} B, "
          f"avg new stored {sum(c[2] for c in per_child) // n} B (max new raw {max(c[1] for c in per_child)} B); "
          f"total raw {raw_total} B vs stored {stored_total} B = {raw_total / max(stored_total, 1):.2f}x")


def _materialize(st, name, ns, path):
    st.materialize(name, str(path), namespace=ns)
    return path
