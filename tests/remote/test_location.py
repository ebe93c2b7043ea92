"""Naming a store: a directory or s3://BUCKET/PREFIX, the S3 store's cache directory and size (no server needed)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT

from kvstore.config import LocationError, default_cache_dir, locate, parse_s3_url, parse_size


@pytest.mark.parametrize("url,expect", [
    ("s3://kvstore", ("kvstore", "")),
    ("s3://kv-store.team1/", ("kv-store.team1", "")),
    ("s3://abc/states", ("abc", "states")),
    ("s3://abc/team/a/states/", ("abc", "team/a/states")),
])
def test_s3_urls(url, expect):
    assert parse_s3_url(url) == expect


@pytest.mark.parametrize("url,says", [
    ("s3://", "no bucket"),
    ("s3:///prefix", "no bucket"),
    ("s3://ab", "not a valid bucket name"),
    ("s3://Upper", "not a valid bucket name"),
    ("s3://under_score/x", "not a valid bucket name"),
    ("s3://-abc", "not a valid bucket name"),
    ("s3://a..b", "not a valid bucket name"),
    ("s3://abc/a//b", "invalid prefix"),
    ("s3://abc/a/../b", "invalid prefix"),
    ("s3://abc/a\\b", "invalid prefix"),
    ("s3://abc/a\nb", "invalid prefix"),
])
def test_bad_s3_urls(url, says):
    with pytest.raises(LocationError, match=says):
        parse_s3_url(url)


@pytest.mark.parametrize("text,n", [
    ("100000", 100000), ("10G", 10 << 30), ("512m", 512 << 20), ("1.5G", 3 << 29), ("2GiB", 2 << 30),
    ("4 KB", 4096), ("1T", 1 << 40), (12345, 12345), (None, None),
])
def test_sizes(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "G", "10X", "-5G", "0", "ten", "10 G B"])
def test_bad_sizes(text):
    with pytest.raises(LocationError, match="cache size"):
        parse_size(text)


def test_default_cache_dir_per_endpoint_and_url(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9000")
    a = default_cache_dir("s3://abc/x")
    assert a.parent == tmp_path / "kvstore" and len(a.name) == 16
    assert default_cache_dir("s3://abc/x") == a
    assert default_cache_dir("s3://abc/y") != a
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9001")
    assert default_cache_dir("s3://abc/x") != a  # one bucket name at another endpoint is another store
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_cache_dir("s3://abc/x").parent == tmp_path / "home" / ".cache" / "kvstore"


def test_locate(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    loc = locate("s3://abc/p/", cache_size="1G")
    assert loc.remote and loc.url == "s3://abc/p" and loc.target == "s3://abc/p"
    assert loc.cache == default_cache_dir("s3://abc/p") and loc.cache_size == 1 << 30
    assert loc.sync == loc.cache / "sync"  # llama-server's --slot-save-path lives under the cache
    loc = locate("s3://abc/p", cache=tmp_path / "mine")
    assert loc.cache == tmp_path / "mine" and loc.sync == tmp_path / "mine" / "sync"
    monkeypatch.setenv("KVSTORE_DIR", "s3://fromenv")
    assert locate().url == "s3://fromenv"
    loc = locate(tmp_path / "local")
    assert not loc.remote and loc.path == tmp_path / "local" and loc.sync == tmp_path / "local" / "sync"
    with pytest.raises(LocationError, match="for an S3 store"):
        locate(tmp_path / "local", cache=tmp_path / "c")
    with pytest.raises(LocationError, match="unsupported store URL"):
        locate("gs://bucket/x")
    assert not (tmp_path / "c").exists() and not (tmp_path / "local").exists()  # parsing creates nothing


def test_open_store_refuses_bad_locations_before_creating_anything(tmp_path, monkeypatch):
    import kvstore

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "c"))
    for bad in ("s3://x", "s3://", "http://host/bucket"):
        with pytest.raises(ValueError):
            kvstore.open_store(bad)
    with pytest.raises(ValueError, match="cache size"):
        kvstore.open_store("s3://abc", cache_size="lots")
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("variable,value,unit", [
    ("KVSTORE_S3_RANGE_MIB", "lots", "MiB"), ("KVSTORE_S3_RANGE_MIB", "0", "MiB"),
    ("KVSTORE_S3_RANGE_MIB", "-8", "MiB"), ("KVSTORE_S3_RANGE_MIB", "4096", "MiB"),
    ("KVSTORE_S3_TIMEOUT", "soon", "seconds"), ("KVSTORE_S3_TIMEOUT", "0", "seconds"),
    ("KVSTORE_S3_TIMEOUT", "nan", "seconds"), ("KVSTORE_S3_TIMEOUT", "86400", "seconds"),
])
def test_a_bad_client_setting_is_refused_before_anything_is_made(tmp_path, monkeypatch, variable, value, unit):
    from kvstore import _core

    monkeypatch.setenv(variable, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(_core.KvStoreError, match=f"{variable}={value} must be a number of {unit} from"):
        _core.Store("s3://abc/x", cache=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("value", ["yes", "1", "ON", "streamed"])
def test_a_bad_stream_setting_is_refused_before_anything_is_made(tmp_path, monkeypatch, value):
    from kvstore import _core

    monkeypatch.setenv("KVSTORE_S3_STREAM", value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(_core.KvStoreError, match=f"KVSTORE_S3_STREAM={value} must be auto, on or off"):
        _core.Store("s3://abc/x", cache=str(tmp_path / "c"))
    assert not (tmp_path / "c").exists()


@pytest.mark.parametrize("stream", [" on ", "off", "auto"])
def test_a_good_client_setting_is_taken(tmp_path, monkeypatch, stream):
    """The bounds are inclusive and a value may carry spaces: nothing a sane setting holds is refused."""
    from kvstore import _core

    monkeypatch.setenv("KVSTORE_S3_TIMEOUT", " 0.1 ")
    monkeypatch.setenv("KVSTORE_S3_RANGE_MIB", "1024")
    monkeypatch.setenv("KVSTORE_S3_STREAM", stream)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(_core.RemoteUnavailable):  # taken, then the dead endpoint is what fails
        _core.Store("s3://abc/x", cache=str(tmp_path / "c"))


def _kv(*args, env=None):
    e = {**os.environ, **(env or {})}
    return subprocess.run([sys.executable, "-m", "kvstore.cli", *map(str, args)], capture_output=True, text=True,
                          cwd=ROOT, env=e, timeout=120)


@pytest.mark.parametrize("argv,says", [
    (["--store", "s3://ab", "ls"], "not a valid bucket name"),
    (["--store", "s3://", "stats"], "no bucket"),
    (["--store", "ftp://host/x", "gc"], "unsupported store URL"),
    (["--store", "s3://abc", "--cache-size", "big", "verify"], "cache size"),
    (["--store", "{local}", "--cache", "{tmp}/c", "ls"], "for an S3 store"),
    (["--store", "{local}", "reindex"], "a local store is its own index"),
    (["--store", "{local}", "verify", "--where", "bucket"], "only an S3 store"),
])
def test_cli_bad_locations(tmp_path, argv, says):
    argv = [a.format(local=tmp_path / "local", tmp=tmp_path) for a in argv]
    if "reindex" in argv or "--where" in argv:
        _kv("--store", tmp_path / "local", "ls")  # an existing (empty) local store
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = _kv(*argv, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.startswith("kvstore: error: ") and says in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing created or changed


def test_cli_names_a_bad_client_setting_not_the_location(tmp_path):
    """The location is fine, the environment is not: the one line says which variable, and nothing is made."""
    r = _kv("--store", "s3://abc/x", "--cache", tmp_path / "c", "ls",
            env={"KVSTORE_S3_TIMEOUT": "soon", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr == ('kvstore: error: bad setting for bucket store "s3://abc/x": KVSTORE_S3_TIMEOUT=soon must be '
                        "a number of seconds from 0.1 to 3600\n"), r.stderr
    assert not list(tmp_path.iterdir())


def test_cli_help_names_s3():
    r = _kv("--help")
    assert r.returncode == 0 and "s3://BUCKET/PREFIX" in r.stdout and "--cache-size" in r.stdout
    r = _kv("verify", "--help")
    assert "--where" in r.stdout
    r = _kv("reindex", "--help")
    assert r.returncode == 0


def test_sync_dir_of_a_local_store(tmp_path):
    import kvstore
    from kvstore.config import sync_dir_of

    st = kvstore.open_store(tmp_path / "s")
    assert sync_dir_of(st) == Path(st.path) / "sync" and sync_dir_of(st).is_dir()
