"""Shared fixtures: the two PyPI test models, real llama.cpp servers (xllamacpp), real slot files, fresh stores.

Everything runs against the real llama.cpp server code; nothing is mocked. Servers are kept small (1-2 slots,
1-2k context, cache_ram 0, 2 threads) and shared per session where a test does not need a fresh one.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
for p in (str(ROOT), str(TESTS)):
    if p not in sys.path:
        sys.path.insert(0, p)

from kvstore.engine import EmbeddedServer, EngineConfig, wait_healthy  # noqa: E402
from kvstore.models import gemma3_path, smollm2_path  # noqa: E402

# The test oracle: the project's own independent slot-file reader (never imports kvstore).
ORACLE = TESTS / "slotfile.py"
MODELS = ("smollm2", "gemma3")

# The server settings make_states.py uses for every file (cache_ram 0, 2 threads, ubatch 256), plus each case's.
BASE_CONFIG = dict(cache_ram=0, threads=2, ubatch_size=256)
CASE_CONFIG = {
    "fa_on": dict(parallel=1, ctx_size=2048, flash_attn="on"),
    "fa_off": dict(parallel=1, ctx_size=2048, flash_attn="off"),
    "q8": dict(parallel=1, ctx_size=2048, flash_attn="on", cache_type_k="q8_0", cache_type_v="q8_0"),
    "np2_slot1": dict(parallel=2, ctx_size=4096, flash_attn="on"),
    "empty": dict(parallel=2, ctx_size=4096, flash_attn="on"),
    "parent": dict(parallel=2, ctx_size=4096, flash_attn="on"),
    "child": dict(parallel=2, ctx_size=4096, flash_attn="on"),
}


# ---------------------------------------------------------------------------------------------------------------
# HTTP helpers (tests talk to llama-server exactly like a client would)

def http(url: str, body: Optional[dict] = None, *, timeout: float = 600.0) -> tuple[int, Any]:
    """GET (body None) or POST JSON; returns (status, decoded JSON or text) without raising on HTTP errors."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            raw, status = r.read(), r.status
    except urllib.error.HTTPError as e:
        raw, status = e.read(), e.code
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode("utf-8", "replace")


def post_ok(url: str, body: dict) -> dict:
    status, doc = http(url, body)
    assert status == 200, f"POST {url} -> {status}: {doc}"
    return doc


def complete(url: str, prompt, slot: int, n_predict: int = 8) -> dict:
    """Greedy completion in a given slot, reusing its cache (the only way tests drive generation)."""
    return post_ok(url + "/completion", {"prompt": prompt, "id_slot": slot, "cache_prompt": True,
                                         "n_predict": n_predict, "temperature": 0.0, "top_k": 1, "seed": 1,
                                         "ignore_eos": True})


def tokenize(url: str, text: str) -> list[int]:
    return post_ok(url + "/tokenize", {"content": text, "add_special": False})["tokens"]


# ---------------------------------------------------------------------------------------------------------------
# files and trees

def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def tree_snapshot(path, exclude: tuple = ()) -> dict[str, tuple[int, str]]:
    """{relative path: (size, sha256)} of every file under `path` (directories as (-1, "")); for
    "nothing was written" checks. `exclude`: relative paths (files or directories) to leave out."""
    root = Path(path)
    out: dict[str, tuple[int, str]] = {}
    if not root.exists():
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        keep = []
        for d in dirnames:
            rel = str(rel_dir / d)
            if rel in exclude:
                continue
            keep.append(d)
            out[rel + "/"] = (-1, "")
        dirnames[:] = keep
        for f in filenames:
            rel = str(rel_dir / f)
            if rel in exclude:
                continue
            fp = Path(dirpath) / f
            out[rel] = (fp.stat().st_size, sha256_file(fp))
    return out


@pytest.fixture(scope="session")
def oracle():
    """tests/slotfile.py: parse/split/rebuild/rows/diff of slot files, written from the format alone."""
    import slotfile

    return slotfile


def oracle_tokens(oracle_mod, src) -> list[int]:
    """The token ids of a slot file (path or bytes) according to the oracle."""
    data = src if isinstance(src, (bytes, bytearray)) else Path(src).read_bytes()
    return [int(t) for t in oracle_mod.parse(data)["tokens"]["tokens"]]


def kv_row_bytes(oracle_mod, path) -> dict[str, int]:
    """Bytes per cell of the main body (K and V rows of every layer of every section) and file facts."""
    info = oracle_mod.parse(Path(path).read_bytes())
    per_cell = 0
    for sec in info["sections"]:
        for st in sec["streams"]:
            if st["cell_count"]:
                per_cell += sum(e["row"] for e in st["K"]) + sum(e["row"] for e in st["V"])
                break  # one stream holds the sequence
    app = info.get("appendix")
    return {"per_cell": per_cell, "n_tokens": info["tokens"]["n_tokens"], "appendix_bytes":
            (app["end"] - app["start"]) if app else 0, "n_checkpoints": len(app["checkpoints"]) if app else 0}


# ---------------------------------------------------------------------------------------------------------------
# models, servers, state files, stores

@pytest.fixture(scope="session")
def models() -> dict[str, Path]:
    return {"smollm2": smollm2_path(), "gemma3": gemma3_path()}


class Server:
    """A running embedded llama-server: `.url`, `.config`, `.save_dir`; `.close()`."""

    def __init__(self, model: Path, save_dir: Optional[Path] = None, **kw):
        cfg = {**BASE_CONFIG, **kw}
        self.save_dir = Path(save_dir) if save_dir else None
        self.config = EngineConfig(model=str(model), slot_save_path=str(save_dir) if save_dir else None, **cfg)
        self._srv = EmbeddedServer(self.config)
        self.url = self._srv.url
        wait_healthy(self.url)

    def close(self) -> None:
        self._srv.close()


@pytest.fixture
def start_server(models) -> Iterator:
    """Factory: `start_server("smollm2", save_dir, parallel=1, ...)`; every server is closed after the test."""
    started: list[Server] = []

    def start(model: str, save_dir=None, **kw) -> Server:
        s = Server(models[model], save_dir, **kw)
        started.append(s)
        return s

    yield start
    for s in reversed(started):
        s.close()


@pytest.fixture(scope="session")
def state_files(tmp_path_factory) -> dict[str, Path]:
    """Real slot files from tests/make_states.py (both models; see its docstring), generated once per session.

    Set KVSTORE_TEST_STATES=DIR to reuse files generated earlier (`python3 tests/make_states.py DIR`)."""
    from make_states import ALL_CASES, make_states

    given = os.environ.get("KVSTORE_TEST_STATES")
    if given and all((Path(given) / f"{c}.bin").is_file() for c in ALL_CASES):
        out = Path(given)
    else:
        out = tmp_path_factory.mktemp("states")
        make_states(out)
    files = {c: out / f"{c}.bin" for c in ALL_CASES}
    missing = [c for c, p in files.items() if not p.is_file()]
    assert not missing, f"make_states did not write {missing}"
    os.environ.setdefault("KVSTORE_STATE_DIR", str(out))
    for f in files.values():  # tests must never modify these
        os.chmod(f, 0o444)
    return files


@pytest.fixture
def store(tmp_path):
    """A fresh store in tmp_path/store."""
    import kvstore

    return kvstore.open_store(tmp_path / "store")


class ServedStore:
    """A store plus a plain llama-server whose --slot-save-path is the store's sync directory."""

    def __init__(self, model: str, root: Path, models: dict, **kw):
        import kvstore
        from kvstore.config import sync_dir

        self.model = model
        self.store = kvstore.open_store(root / "store")
        self.sync = sync_dir(Path(self.store.path))
        self.server = Server(models[model], self.sync, **kw)
        self.url = self.server.url

    def close(self):
        self.server.close()


def _served(model: str, tmp_path_factory, models):
    s = ServedStore(model, tmp_path_factory.mktemp(f"served-{model}"), models, parallel=2, ctx_size=2048,
                    flash_attn="on")
    return s


@pytest.fixture(scope="session")
def served_smollm2(tmp_path_factory, models):
    s = _served("smollm2", tmp_path_factory, models)
    yield s
    s.close()


@pytest.fixture(scope="session")
def served_gemma3(tmp_path_factory, models):
    s = _served("gemma3", tmp_path_factory, models)
    yield s
    s.close()


@pytest.fixture
def served(request):
    """Parametrize indirectly with a model name: the session's ServedStore for it."""
    return request.getfixturevalue(f"served_{request.param}")


def copy_state(src: Path, dst: Path) -> Path:
    shutil.copyfile(src, dst)
    os.chmod(dst, 0o644)
    return dst


# ---------------------------------------------------------------------------------------------------------------
# a real S3 server (SeaweedFS, tests/seaweed.py) for stores in a bucket

S3_BUCKET = "kvstore-test"


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory):
    """One SeaweedFS per session (loopback, fresh data dir) with the bucket S3_BUCKET. Its address reaches only
    the processes given `seaweed.env()` and the tests that use `s3env`: nothing is set in os.environ here."""
    from seaweed import SeaweedFS

    sw = SeaweedFS(tmp_path_factory.mktemp("seaweed")).start()
    try:
        sw.create_bucket(S3_BUCKET)
        yield sw
    finally:
        sw.stop()


@pytest.fixture
def s3env(seaweed, monkeypatch):
    """The AWS variables pointing at the session's SeaweedFS, in this process, for this test only."""
    env = seaweed.env({})
    for k in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return env


@pytest.fixture
def s3_url(seaweed, request) -> str:
    """A fresh store location in the session's bucket: s3://kvstore-test/<test name>-<random>."""
    import re
    import uuid

    slug = re.sub(r"[^a-z0-9-]+", "-", request.node.name.lower()).strip("-")[:40]
    return f"s3://{S3_BUCKET}/{slug}-{uuid.uuid4().hex[:8]}"


# ---------------------------------------------------------------------------------------------------------------
# reading the store's open format from outside (another process, as a third-party tool would)

_DUMP = r"""
import json, sys, lmdb
env = lmdb.open(sys.argv[1], readonly=True, lock=False, max_dbs=16, subdir=True)
out = {}
for table in ("meta", "names", "manifests", "objects", "prefixes"):
    try:
        db = env.open_db(table.encode(), create=False)
    except lmdb.NotFoundError:
        out[table] = None
        continue
    rows = {}
    with env.begin(db=db) as txn:
        for k, v in txn.cursor():
            rows[k.hex()] = v.hex()
    out[table] = rows
print(json.dumps(out))
"""


def dump_index(store_dir) -> dict:
    """Every table of the store's LMDB as {table: {key hex: value hex}}, read by the `lmdb` package in a
    separate process (LMDB must not be opened twice in one process)."""
    import subprocess

    r = subprocess.run([sys.executable, "-c", _DUMP, str(Path(store_dir) / "index")], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def manifests_by_name(store_dir, namespace: str = "") -> dict[str, dict]:
    """{name: manifest JSON} for one namespace, from the LMDB tables."""
    idx = dump_index(store_dir)
    out = {}
    for k, v in idx["names"].items():
        ns, _, name = bytes.fromhex(k).decode().partition("\0")
        if ns != namespace:
            continue
        entry = json.loads(bytes.fromhex(v))
        out[name] = json.loads(bytes.fromhex(idx["manifests"][entry["manifest"]]))
        out[name]["_id"] = entry["manifest"]
    return out


def object_path(store_dir, object_id: str) -> Path:
    return Path(store_dir) / "objects" / object_id[:2] / object_id
