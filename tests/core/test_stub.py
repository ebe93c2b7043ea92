"""kvstore/_core.pyi must describe the compiled module exactly: mypy's stubtest compares them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

STUB = Path(__file__).resolve().parents[2] / "kvstore" / "_core.pyi"


def stubtest(tmp_path: Path, stub_text: str) -> subprocess.CompletedProcess:
    """Run stubtest on `kvstore._core` against `stub_text`, from a directory outside the source tree."""
    pkg = tmp_path / "stubs" / "kvstore"
    pkg.mkdir(parents=True)
    (pkg / "__init__.pyi").write_text("")
    (pkg / "_core.pyi").write_text(stub_text)
    env = dict(os.environ, MYPYPATH=str(tmp_path / "stubs"))
    return subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "kvstore._core", "--mypy-config-file", os.devnull],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )


def test_stub_matches_compiled_module(tmp_path):
    r = stubtest(tmp_path, STUB.read_text())
    assert r.returncode == 0, f"kvstore/_core.pyi has drifted from the compiled module:\n{r.stdout}{r.stderr}"


def test_stubtest_catches_drift(tmp_path):
    """The check above can fail: a stub with a parameter the module lacks, or without a module attribute."""
    text = STUB.read_text()
    drifted = text.replace("def hash_file(path: str) -> str:", "def hash_file(path: str, chunk: int) -> str:")
    assert drifted != text
    r = stubtest(tmp_path, drifted)
    assert r.returncode != 0 and "hash_file" in r.stdout, r.stdout
    missing = "\n".join(line for line in text.splitlines() if not line.startswith("DEFAULT_BLOCK_SIZE"))
    (tmp_path / "b").mkdir()
    r = stubtest(tmp_path / "b", missing)
    assert r.returncode != 0 and "DEFAULT_BLOCK_SIZE" in r.stdout, r.stdout
