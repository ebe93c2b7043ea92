"""The soak (bench/soak.py), short: a user's traffic against the real `kvstore serve` CLI on each model family, two
tenants sending the same texts, six clients in flight on two slots, the four kinds of names (users, articles,
questions with a parent, a pinned user), bad requests among them, a cap that evicts, and a restart by SIGTERM with
requests in flight. Every promise it checks must hold (its docstring lists them), on a local store and on an S3 bucket
(SeaweedFS); and its tenancy check must see a leak where there is one (both tenants' keys in one namespace)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT
from tinymodels import tiny_model_path


def soak(tmp_path: Path, model: str, *args: str) -> tuple[int, dict, str]:
    out = tmp_path / "soak.json"
    r = subprocess.run([sys.executable, "-m", "bench.soak", "--model", model, "--out", str(out), *args], cwd=ROOT,
                       capture_output=True, text=True, timeout=500)
    assert out.exists(), r.stderr[-3000:]
    return r.returncode, json.loads(out.read_text()), r.stderr[-3000:]


def tiny(arch: str, tmp_path: Path) -> str:
    return str(tiny_model_path(arch, Path(os.environ.get("KVSTORE_TINY_MODELS") or tmp_path / "models")))


# (model, seconds, --max-size MiB): caps small enough that names are evicted while the soak runs.
CASES = [("smollm2", 45, 48), ("gemma3", 45, 64), ("lfm2", 30, 4)]


@pytest.mark.timeout(560)
@pytest.mark.parametrize("model,seconds,cap", CASES, ids=[c[0] for c in CASES])
def test_a_short_soak_keeps_every_promise(model, seconds, cap, tmp_path):
    path = tiny(model, tmp_path) if model == "lfm2" else model
    rc, res, err = soak(tmp_path, path, "--seconds", str(seconds), "--restarts", "1", "--max-size", str(cap))
    assert res["failures"] == [] and rc == 0, (res["failures"], err)
    assert res["restarts"] == 1 and res["answered"] >= 30 and res["bad_requests"] > 0, res
    restored = sum(res["kv_cache"].get(k, 0) for k in ("restored", "parent", "prefix"))
    assert restored >= res["answered"] // 4, res["kv_cache"]  # the store served returning users and questions
    assert res["evictions"] > 0 and res["max_objects_bytes"] <= res["max_size"], res
    assert res["verify"]["objects_checked"] > 0 and not res["verify"]["corrupt"] and not res["verify"]["missing"]


@pytest.mark.timeout(560)
def test_a_short_soak_on_a_bucket_keeps_every_promise(tmp_path):
    """The store in a bucket with its cache: a prune rewrites packs there, whose copies must fit below the cap (the
    bucket passed a 48 MiB cap by up to 6 MB before they did). The soak itself fails a sample over the cap unless
    the server reported the cap unmeetable (pinned and in-use names fill it), which it counts apart."""
    rc, res, err = soak(tmp_path, "smollm2", "--seconds", "45", "--restarts", "1", "--max-size", "48", "--bucket")
    assert res["failures"] == [] and rc == 0, (res["failures"], err)
    assert res["store"] == "bucket" and res["restarts"] == 1 and res["answered"] >= 30, res
    assert res["evictions"] > 0, res
    assert res["max_objects_bytes"] <= res["max_size"] or res["samples_over_cap_while_unmet"] > 0, res
    assert res["verify"]["objects_checked"] > 0 and not res["verify"]["corrupt"] and not res["verify"]["missing"]


@pytest.mark.timeout(400)
def test_the_soak_sees_a_tenant_reuse_another_tenants_cells(tmp_path):
    """Both keys in one namespace: the second tenant continues the first one's states of the same names, and its
    replies' cache_n pass what it sent itself."""
    rc, res, err = soak(tmp_path, "smollm2", "--seconds", "25", "--restarts", "0", "--one-namespace")
    leaks = [f for f in res["failures"] if "passes the" in f and "its own tenant had sent" in f]
    assert rc == 1 and leaks, (res["failures"], err)
