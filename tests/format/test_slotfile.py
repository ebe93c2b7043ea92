"""The test oracle itself (tests/slotfile.py): independent of kvstore, and it accounts for every byte of every
real slot file (split into pieces and rebuilt, byte for byte), so what the other tests learn from it is whole."""
from __future__ import annotations

import subprocess
import sys

from conftest import ORACLE, TESTS


def test_oracle_never_imports_kvstore():
    code = (f"import sys; sys.path.insert(0, {str(TESTS)!r}); import slotfile; "
            "assert not [m for m in sys.modules if m.split('.')[0] in ('kvstore', 'hooks')], sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert ORACLE.parent == TESTS


def test_oracle_rebuilds_every_real_file(state_files, oracle):
    for case, path in state_files.items():
        data = path.read_bytes()
        pieces = oracle.split(data)
        assert oracle.rebuild(pieces) == data, case
        info = oracle.parse(data)
        held = [st for sec in info["sections"] for st in sec["streams"] if st["cell_count"]]
        # every body section holds one cell per token (SWA sections at most that many)
        assert all(st["cell_count"] <= info["tokens"]["n_tokens"] for st in held), case
        assert (info["tokens"]["n_tokens"] == 0) == (not held), case
        if held:
            assert held[0]["cell_count"] == info["tokens"]["n_tokens"], case
            assert sum(p[0] == "rows" for p in pieces) >= 2 * held[0]["n_layer"], case
        r = subprocess.run([sys.executable, str(ORACLE), "check", str(path)], capture_output=True, text=True)
        assert r.returncode == 0 and "byte-exact" in r.stdout, (case, r.stdout, r.stderr)


def test_oracle_sees_a_changed_row(state_files, oracle):
    data = state_files["smollm2_fa_off"].read_bytes()  # transposed V
    info = oracle.parse(data)
    st = info["sections"][0]["streams"][0]
    v = st["V"][3]
    cell = 5
    b = bytearray(data)
    b[v["off"] + cell * v["el"]] ^= 0x01  # element 0 of cell 5 (element-major)
    d = {x["key"]: x for x in oracle.diff(data, bytes(b))}
    assert d[("body", 0, 3, "V")]["identical"] == st["cell_count"] - 1
    assert all(x["identical"] == x["common"] for k, x in d.items() if k != ("body", 0, 3, "V"))
    r = subprocess.run([sys.executable, str(ORACLE), "info", "/dev/null"], capture_output=True, text=True)
    assert r.returncode != 0
