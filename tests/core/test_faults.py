"""Faults: a writer killed at any moment, and a full disk, leave the store consistent and committed states intact."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import ROOT

import kvstore
from kvstore import StoreFull

INGEST_CHILD = r"""
import sys
import kvstore
st = kvstore.Store(sys.argv[1], level=int(sys.argv[2]))
print("ready", flush=True)
for i, f in enumerate(sys.argv[4:]):
    st.ingest(f"{sys.argv[3]}-{i}", f)
    print("committed", i, flush=True)
print("done", flush=True)
"""

FULL_CHILD = r"""
import sys
import kvstore
st = kvstore.Store(sys.argv[1])
try:
    st.ingest("big", sys.argv[2])
except kvstore.StoreFull as e:
    print("StoreFull:", e, flush=True)
    sys.exit(0)
except Exception as e:
    print(type(e).__name__ + ":", e, flush=True)
    sys.exit(3)
print("no error", flush=True)
sys.exit(4)
"""


def _temp_files(store_dir: Path) -> list[Path]:
    return [p for p in store_dir.rglob("*") if p.is_file() and p.name.startswith(".tmp")]


def _check_consistent(st, committed: dict[str, Path], tmp_path: Path) -> None:
    v = st.verify()
    assert v["corrupt"] == [] and v["missing"] == [], v
    for name, src in committed.items():
        out = tmp_path / "check.bin"
        st.materialize(name, str(out))
        assert out.read_bytes() == src.read_bytes(), name
        out.unlink()


def test_kill_mid_write(state_files, tmp_path):
    d = tmp_path / "store"
    st = kvstore.open_store(d)
    base = state_files["smollm2_fa_on"]
    st.ingest("base", str(base))
    committed = {"base": base}
    rounds = [
        (0.05, ["gemma3_child"]),
        (0.4, ["gemma3_child", "smollm2_child"]),
        (1.0, ["gemma3_parent", "smollm2_parent", "gemma3_child"]),
        (0.0, ["smollm2_child"]),
        (2.0, ["smollm2_parent", "gemma3_np2_slot1", "gemma3_child"]),
    ]
    killed_mid = 0
    for k, (delay, cases) in enumerate(rounds):
        files = [state_files[c] for c in cases]
        # zstd level 19 makes the writes slow enough for the kills to land inside them
        p = subprocess.Popen([sys.executable, "-c", INGEST_CHILD, str(d), "19", f"r{k}", *map(str, files)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        assert p.stdout.readline().strip() == "ready", p.stderr.read()
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        out, err = p.communicate(timeout=60)
        done = [int(line.split()[1]) for line in out.splitlines() if line.startswith("committed")]
        if p.returncode == -signal.SIGKILL and "done" not in out:
            killed_mid += 1
        for i in done:  # names the child reported committed must survive
            committed[f"r{k}-{i}"] = files[i]
        # committed states are intact, nothing is corrupt (verify re-hashes every object)
        _check_consistent(st, committed, tmp_path)
        for i in range(len(files)):  # a name is either absent or complete
            name = f"r{k}-{i}"
            if name not in committed and st.get(name) is not None:
                committed[name] = files[i]
        _check_consistent(st, committed, tmp_path)
    assert killed_mid >= 3, "the kills did not interrupt the writer"
    r = subprocess.run([sys.executable, "-m", "kvstore.cli", "--store", str(d), "verify"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 0, (r.stdout, r.stderr)
    g = st.gc(grace_seconds=0)
    assert not _temp_files(d), (g, _temp_files(d))
    _check_consistent(st, committed, tmp_path)
    print(f"\n[faults] {killed_mid} writers killed mid-ingest; gc removed {g.get('removed_temp')} temp files, "
          f"{g.get('dead_objects')} unreferenced objects")


def _mount_small_fs(where: Path, size_mib: int, tmp_path: Path):
    """Mount a size_mib filesystem at `where`; return the unmount function, or None if we may not mount."""
    where.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(where)],
                       capture_output=True, text=True)
    if r.returncode == 0:
        return lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)
    img = tmp_path / "small.img"
    try:
        subprocess.run(["truncate", "-s", f"{size_mib}M", str(img)], check=True, capture_output=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True, capture_output=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(where)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return lambda: subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_full_disk(state_files, tmp_path):
    mnt = tmp_path / "small"
    umount = _mount_small_fs(mnt, 4, tmp_path)
    base, big = state_files["smollm2_fa_on"], state_files["gemma3_child"]
    if umount is None:
        # No mount allowed here (not root / no loop devices): the LMDB map is the full resource instead.
        print("\n[faults] cannot mount a small filesystem here; testing StoreFull through a tiny LMDB map")
        st = kvstore.open_store(tmp_path / "store", map_size_mib=1)
        st.ingest("base", str(base))
        with pytest.raises(StoreFull):
            for i in range(2000):
                st.ingest(f"n{i}", str(state_files["gemma3_child"]))
        _check_consistent(st, {"base": base}, tmp_path)
        return
    try:
        d = mnt / "store"
        st = kvstore.open_store(d)
        st.ingest("base", str(base))
        # a separate process: a store that maps its index could be killed by SIGBUS on a full tmpfs
        r = subprocess.run([sys.executable, "-c", FULL_CHILD, str(d), str(big)], capture_output=True, text=True,
                           cwd=ROOT, timeout=300)
        assert r.returncode == 0, f"expected StoreFull, got rc {r.returncode}: {r.stdout} {r.stderr[-2000:]}"
        assert st.get("big") is None
        _check_consistent(st, {"base": base}, tmp_path)
        # in this process too
        with pytest.raises(StoreFull):
            st.ingest("big", str(big))
        assert st.get("big") is None
        _check_consistent(st, {"base": base}, tmp_path)
        # gc frees the orphans of the failed ingests; the store works again
        st.gc(grace_seconds=0)
        assert not _temp_files(d)
        st.ingest("small", str(state_files["smollm2_np2_slot1"]))
        _check_consistent(st, {"base": base, "small": state_files["smollm2_np2_slot1"]}, tmp_path)
    finally:
        umount()
