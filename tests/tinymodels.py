"""Tiny seeded GGUF models of recurrent and hybrid architectures, written with llama.cpp's own `gguf` writer.

No small hybrid or recurrent GGUF ships in a PyPI package, so the tests build their own:
* `lfm2`: LiquidAI's LFM2 hybrid (short-convolution layers with a conv state, plus attention layers with a KV
  cache): llama.cpp keeps it in `llama_memory_hybrid`, so a slot file holds a KV section, then a recurrent one.
* `mamba2`: a pure Mamba-2 model (`llama_memory_recurrent`: per layer a conv state and an SSM state).

Shapes follow llama.cpp's `src/models/lfm2.cpp` and `src/models/mamba2.cpp` (tensor lists) and `gguf-py`
(key names). Weights are seeded Gaussians scaled by 1/sqrt(fan_in), so activations stay O(1) and greedy
output is neither constant nor NaN. The tokenizer (metadata only) is copied from the SmolLM2 GGUF, so prompts
tokenize like SmolLM2's. Writing one model takes well under a second; `tiny_model_path` caches per directory.

`write_tiny_lora` writes a seeded LoRA adapter for SmolLM2 the same way.

`python3 tests/tinymodels.py DIR` writes both models into DIR.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

ARCHS = ("lfm2", "mamba2")
SEED = 20261203
CTX_TRAIN = 4096
N_EMBD = 64


def _tokenizer_fields(writer, src: Path) -> int:
    """Copy every `tokenizer.*` key of `src` into `writer`; returns the vocabulary size."""
    import gguf

    reader = gguf.GGUFReader(str(src))
    n_vocab = 0
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        vtype = field.types[0]
        value = field.contents()
        if vtype == gguf.GGUFValueType.ARRAY:
            sub = field.types[-1]
            writer.add_key_value(name, value, vtype, sub_type=sub)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(value)
        else:
            writer.add_key_value(name, value, vtype)
    if not n_vocab:
        raise ValueError(f"{src} has no tokenizer.ggml.tokens")
    return n_vocab


class _Weights:
    """Seeded tensors; numpy shapes are ggml's `ne` reversed."""

    def __init__(self, writer, seed: int):
        self.w = writer
        self.rng = np.random.default_rng(seed)

    def mat(self, name: str, n_in: int, n_out: int, gain: float = 1.0) -> None:
        a = self.rng.standard_normal((n_out, n_in), dtype=np.float32) * np.float32(gain / np.sqrt(n_in))
        self.w.add_tensor(name, a)

    def fill(self, name: str, shape: tuple, value: float) -> None:
        self.w.add_tensor(name, np.full(shape, value, dtype=np.float32))

    def normal(self, name: str, shape: tuple, scale: float) -> None:
        self.w.add_tensor(name, self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale))

    def vocab(self, n_vocab: int) -> None:
        """Embedding and a separate (untied) output matrix, f16 to halve the file. Tied weights would make
        the argmax echo the input token (its own embedding dominates the dot products)."""
        for name in ("token_embd.weight", "output.weight"):
            a = self.rng.standard_normal((n_vocab, N_EMBD), dtype=np.float32)
            self.w.add_tensor(name, a.astype(np.float16))


def _common(writer, n_layer: int) -> None:
    writer.add_context_length(CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(1)  # f16 vocabulary matrices, f32 elsewhere


def _lfm2(writer, w: _Weights, n_vocab: int) -> None:
    # conv, attention, conv, attention: two layers of each kind, so both sections have more than one layer.
    head_kv = [0, 2, 0, 2]
    n_head, n_ff, l_cache = 4, 128, 3
    head_dim = N_EMBD // n_head
    _common(writer, len(head_kv))
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(head_kv)
    writer.add_rope_freq_base(10000.0)
    writer.add_shortconv_l_cache(l_cache)
    w.vocab(n_vocab)
    w.fill("token_embd_norm.weight", (N_EMBD,), 1.0)
    for i, n_kv in enumerate(head_kv):
        b = f"blk.{i}."
        w.fill(b + "attn_norm.weight", (N_EMBD,), 1.0)
        w.fill(b + "ffn_norm.weight", (N_EMBD,), 1.0)
        w.mat(b + "ffn_gate.weight", N_EMBD, n_ff)
        w.mat(b + "ffn_up.weight", N_EMBD, n_ff)
        w.mat(b + "ffn_down.weight", n_ff, N_EMBD)
        if n_kv:
            w.fill(b + "attn_q_norm.weight", (head_dim,), 1.0)
            w.fill(b + "attn_k_norm.weight", (head_dim,), 1.0)
            w.mat(b + "attn_q.weight", N_EMBD, N_EMBD)
            w.mat(b + "attn_k.weight", N_EMBD, n_kv * head_dim)
            w.mat(b + "attn_v.weight", N_EMBD, n_kv * head_dim)
            w.mat(b + "attn_output.weight", N_EMBD, N_EMBD)
        else:
            w.normal(b + "shortconv.conv.weight", (N_EMBD, l_cache), 1.0 / np.sqrt(l_cache))
            w.mat(b + "shortconv.in_proj.weight", N_EMBD, 3 * N_EMBD)
            w.mat(b + "shortconv.out_proj.weight", N_EMBD, N_EMBD)


def _mamba2(writer, w: _Weights, n_vocab: int) -> None:
    n_layer, d_inner, d_state, n_group, n_head, d_conv = 3, 128, 16, 1, 4, 4
    conv_dim = d_inner + 2 * n_group * d_state
    _common(writer, n_layer)
    writer.add_ssm_conv_kernel(d_conv)
    writer.add_ssm_inner_size(d_inner)
    writer.add_ssm_state_size(d_state)
    writer.add_ssm_time_step_rank(n_head)
    writer.add_ssm_group_count(n_group)
    w.vocab(n_vocab)
    w.fill("output_norm.weight", (N_EMBD,), 1.0)
    for i in range(n_layer):
        b = f"blk.{i}."
        w.fill(b + "attn_norm.weight", (N_EMBD,), 1.0)
        w.mat(b + "ssm_in.weight", N_EMBD, d_inner + conv_dim + n_head)
        w.normal(b + "ssm_conv1d.weight", (conv_dim, d_conv), 1.0 / np.sqrt(d_conv))
        w.normal(b + "ssm_conv1d.bias", (conv_dim,), 0.1)
        w.normal(b + "ssm_dt.bias", (n_head,), 0.5)
        # A = -exp(A_log) < 0 (llama.cpp stores A itself): decays between 0.5 and 4 keep the state bounded.
        w.w.add_tensor(b + "ssm_a", -np.exp(w.rng.uniform(np.log(0.5), np.log(4.0), (n_head, 1))).astype(np.float32))
        w.fill(b + "ssm_d", (n_head, 1), 1.0)
        w.fill(b + "ssm_norm.weight", (n_group, d_inner // n_group), 1.0)
        w.mat(b + "ssm_out.weight", d_inner, N_EMBD)


_BUILD = {"lfm2": _lfm2, "mamba2": _mamba2}


def _write_gguf(path: Path, arch: str, fill) -> Path:
    """Write a GGUF of `arch` to `path` atomically (a temporary file, then a rename); `fill(writer)` adds its keys
    and tensors."""
    import gguf

    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    writer = gguf.GGUFWriter(str(tmp), arch)
    try:
        fill(writer)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def write_tiny_model(arch: str, path: Path, tokenizer_src: Path, seed: int = SEED) -> Path:
    """Write the tiny `arch` model to `path` (atomically)."""
    def fill(writer) -> None:
        writer.add_name(f"kvstore-tiny-{arch}")
        n_vocab = _tokenizer_fields(writer, tokenizer_src)
        _BUILD[arch](writer, _Weights(writer, seed + ARCHS.index(arch)), n_vocab)

    return _write_gguf(path, arch, fill)


def tiny_model_path(arch: str, directory: Path) -> Path:
    """The tiny `arch` model in `directory`, written on first use."""
    from kvstore.models import smollm2_path

    if arch not in _BUILD:
        raise ValueError(f"unknown tiny architecture {arch!r}; known: {', '.join(ARCHS)}")
    path = Path(directory) / f"tiny-{arch}-{SEED}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_model(arch, path, smollm2_path())
    return path


def write_tiny_lora(path: Path, base: Path, seed: int = SEED, rank: int = 2, layers: int = 4) -> Path:
    """A seeded LoRA adapter for the GGUF `base` (a llama-architecture model: SmolLM2), written with the `gguf`
    writer as llama.cpp's convert_lora_to_gguf.py lays one out: `adapter.type` lora, `adapter.lora.alpha`, and
    `blk.N.attn_q.weight.lora_a` / `.lora_b` for the first `layers` layers. Its weights are large enough that greedy
    output with and without it differs (no small LoRA GGUF ships on PyPI)."""
    import gguf

    reader = gguf.GGUFReader(str(base))
    arch = str(bytes(reader.fields["general.architecture"].parts[-1]), "utf-8")
    shapes = {t.name: [int(x) for x in t.shape] for t in reader.tensors}
    rng = np.random.default_rng(seed)

    def fill(writer) -> None:
        writer.add_string("general.type", "adapter")
        writer.add_string("adapter.type", "lora")
        writer.add_float32("adapter.lora.alpha", float(rank))
        for i in range(layers):
            n_in, n_out = shapes[f"blk.{i}.attn_q.weight"]
            writer.add_tensor(f"blk.{i}.attn_q.weight.lora_a",
                              (rng.standard_normal((rank, n_in)) * 4.0).astype(np.float32))
            writer.add_tensor(f"blk.{i}.attn_q.weight.lora_b",
                              (rng.standard_normal((n_out, rank)) * 4.0).astype(np.float32))

    return _write_gguf(path, arch, fill)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
    for a in ARCHS:
        print(tiny_model_path(a, out))
