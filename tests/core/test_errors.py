"""The exception hierarchy is the core's (kvstore._core), re-exported by kvstore.errors, and each exception
carries its context as attributes; the empty-slot rule and the default block size come from the core too."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kvstore
import kvstore.errors
from kvstore import _core


STUB = Path(__file__).resolve().parents[2] / "kvstore" / "_core.pyi"


def core_exceptions() -> set[str]:
    """The one exception list: the classes the compiled core defines (rust/src/py/errors.rs)."""
    return {n for n, v in vars(_core).items() if isinstance(v, type) and issubclass(v, BaseException)}


def stub_exceptions(text: str) -> set[str]:
    """The exception classes `_core.pyi` declares (classes deriving, through others, from Exception)."""
    classes = {c.name: [b.id for b in c.bases if isinstance(b, ast.Name)]
               for c in ast.parse(text).body if isinstance(c, ast.ClassDef)}

    def is_exception(name: str) -> bool:
        return any(b in ("Exception", "BaseException") or (b in classes and is_exception(b)) for b in classes[name])
    return {n for n in classes if is_exception(n)}


def reexported(module, core: set[str]) -> set[str]:
    """The core's exceptions a Python module hands on: in its `__all__` and the very class of the core."""
    return {n for n in module.__all__ if getattr(module, n) is getattr(_core, n, None) and n in core}


def test_one_hierarchy_defined_by_the_core():
    core = core_exceptions()
    assert {"KvStoreError", "FormatError", "NameNotFound", "RemoteUnavailable", "GcLocked"} <= core, core
    for name in core:
        cls = getattr(_core, name)
        assert getattr(kvstore.errors, name) is cls and getattr(kvstore, name) is cls
        assert cls.__module__ == "kvstore._core"
        assert issubclass(cls, kvstore.KvStoreError)
    assert issubclass(kvstore.NameNotFound, KeyError) and issubclass(kvstore.InvalidName, ValueError)
    assert issubclass(kvstore.StoreFull, OSError) and issubclass(kvstore.ServerError, kvstore.KvStoreError)


def test_the_exception_list_is_the_same_in_every_file():
    """py/errors.rs defines the classes; _core.pyi, kvstore/errors.py and kvstore/__init__.py must name exactly
    those (a class added in Rust and forgotten in one of them, or left there after removal, fails here)."""
    core = core_exceptions()
    text = STUB.read_text()
    assert stub_exceptions(text) == core
    stub_all = next(n.value for n in ast.parse(text).body
                    if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "__all__")
    assert core <= set(ast.literal_eval(stub_all))
    assert reexported(kvstore.errors, core) == core
    assert reexported(kvstore, core) == core
    # The check can fail: a stub that forgets one class differs.
    forgot = text.replace("class GcLocked(KvStoreError):", "class GcLockedRenamed(KvStoreError):")
    assert forgot != text and stub_exceptions(forgot) != core


def test_name_errors_carry_name_and_namespace(store, tmp_path):
    with pytest.raises(kvstore.NameNotFound) as e:
        store.materialize("nope", str(tmp_path / "o.bin"), namespace="tenant")
    assert (e.value.name, e.value.namespace) == ("nope", "tenant")
    assert str(e.value).startswith("no state named 'nope' in namespace 'tenant'")
    with pytest.raises(kvstore.InvalidName) as e:
        store.get("a/b")
    assert (e.value.what, e.value.value) == ("name", "a/b")
    with pytest.raises(kvstore.InvalidName) as e:
        store.get("x", namespace="..")
    assert (e.value.what, e.value.value) == ("namespace", "..")


def test_fingerprint_mismatch_carries_key_and_both_values(store, state_files, tmp_path):
    r = store.ingest("s", str(state_files["smollm2_fa_on"]), fingerprint={"model": "m", "flash_attn": "on"})
    with pytest.raises(kvstore.FingerprintMismatch) as e:
        store.materialize("s", str(tmp_path / "o.bin"), expect={"flash_attn": "off"})
    assert (e.value.name, e.value.key, e.value.stored, e.value.server) == ("s", "flash_attn", "on", "off")
    with pytest.raises(kvstore.FingerprintMismatch) as e:
        store.materialize("s", str(tmp_path / "o.bin"), expect={"n_ctx_slot": "1"})
    assert (e.value.key, e.value.stored, e.value.server) == ("n_ctx_slot", str(r["n_tokens"]), "1")
    assert "raise the context" in str(e.value)
    # Attributes a variant does not know are None, never missing.
    assert kvstore.FingerprintMismatch("x").key is None


def test_corrupt_object_carries_its_id(store, state_files, tmp_path):
    store.ingest("a", str(state_files["smollm2_fa_on"]))
    victim = max((p for p in Path(store.path, "objects").glob("??/*") if p.is_file()), key=lambda p: p.stat().st_size)
    victim.chmod(0o644)
    data = bytearray(victim.read_bytes())
    data[-10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(kvstore.CorruptObject) as e:
        store.materialize("a", str(tmp_path / "o.bin"))
    assert e.value.object_id == victim.name
    assert victim.name[:8] in str(e.value) and "kvstore verify" in str(e.value)


def test_empty_slot_rule_and_block_size_come_from_the_core(tmp_path, state_files):
    store = kvstore.open_store(tmp_path / "s")
    assert store.block_size == _core.DEFAULT_BLOCK_SIZE
    # An empty slot is refused at ingest; its layout (as inspected) is the core's "empty" one, a stored state's is not.
    with pytest.raises(kvstore.FormatError):
        store.ingest("e", str(state_files["smollm2_empty"]))
    assert _core.layout_is_empty(_core.inspect_state(str(state_files["smollm2_empty"]))["layout"])
    store.ingest("f", str(state_files["smollm2_fa_on"]))
    assert not _core.layout_is_empty(store.get("f")["layout"])
