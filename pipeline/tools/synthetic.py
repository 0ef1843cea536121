"""A random-weight llama GGUF of any shape (7B-class by default), written with gguf-py, for
benchmarks that need a model bigger than the machine's memory. The tokenizer is copied from a
real GGUF so the pass reads ordinary text; weights are random Q4_0 blocks whose scale keeps the
hidden state bounded, streamed to disk a tensor at a time."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGUFWriter, Keys
from gguf import GGMLQuantizationType as Q

from ..gguf_io.reader import GGUFIndex


@dataclass(frozen=True)
class Shape:
    layers: int = 32
    hidden: int = 4096
    ffn: int = 11008
    heads: int = 32
    kv_heads: int = 32
    context: int = 4096


def _q4_0(rng: np.random.Generator, rows: int, cols: int, fan_in: int) -> np.ndarray:
    """Random Q4_0 blocks: nibbles uniform in [0, 16), so weights ~ d * (q - 8) with std ~ 1/sqrt(fan_in)."""
    block, size = GGML_QUANT_SIZES[Q.Q4_0]
    raw = rng.integers(0, 256, (rows, cols // block * size), dtype=np.uint8)
    d = np.float16(1.0 / (4.6 * np.sqrt(fan_in)))
    raw.reshape(-1, size)[:, :2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return raw


def _tensors(shape: Shape, vocab: int) -> list[tuple[str, tuple[int, ...], Q]]:
    h, f, kv = shape.hidden, shape.ffn, shape.hidden // shape.heads * shape.kv_heads
    out = [("token_embd.weight", (vocab, h), Q.Q4_0), ("output_norm.weight", (h,), Q.F32),
           ("output.weight", (vocab, h), Q.Q4_0)]
    for i in range(shape.layers):
        out += [(f"blk.{i}.attn_norm.weight", (h,), Q.F32), (f"blk.{i}.ffn_norm.weight", (h,), Q.F32),
                (f"blk.{i}.attn_q.weight", (h, h), Q.Q4_0), (f"blk.{i}.attn_k.weight", (kv, h), Q.Q4_0),
                (f"blk.{i}.attn_v.weight", (kv, h), Q.Q4_0), (f"blk.{i}.attn_output.weight", (h, h), Q.Q4_0),
                (f"blk.{i}.ffn_gate.weight", (f, h), Q.Q4_0), (f"blk.{i}.ffn_up.weight", (f, h), Q.Q4_0),
                (f"blk.{i}.ffn_down.weight", (h, f), Q.Q4_0)]
    return out


def _copy_tokenizer(source: GGUFIndex, w: GGUFWriter) -> None:
    """The BPE tokenizer of `source` (a gpt2-style GGUF such as SmolLM2's)."""
    meta, TK = source.metadata, Keys.Tokenizer
    w.add_tokenizer_model(meta[TK.MODEL])
    if TK.PRE in meta:
        w.add_tokenizer_pre(meta[TK.PRE])
    w.add_token_list(source.strings(TK.LIST))
    w.add_token_types([int(t) for t in np.asarray(meta[TK.TOKEN_TYPE])])
    w.add_token_merges(source.strings(TK.MERGES))
    adders = {TK.BOS_ID: w.add_bos_token_id, TK.EOS_ID: w.add_eos_token_id, TK.ADD_BOS: w.add_add_bos_token}
    for key, add in adders.items():
        if key in meta:
            add(meta[key])


def write_synthetic_gguf(path: Path, shape: Shape, tokenizer_from: Path, seed: int = 0) -> Path:
    """Write the model to `path` (via a temporary name, so a killed write never looks finished)."""
    source = GGUFIndex(tokenizer_from)
    vocab = source.metadata[Keys.Tokenizer.LIST].count
    partial = path.with_name(path.name + ".partial")
    w = GGUFWriter(str(partial), "llama")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    _copy_tokenizer(source, w)
    tensors = _tensors(shape, vocab)
    for name, dims, qtype in tensors:
        block, size = GGML_QUANT_SIZES[qtype]
        stored = dims if qtype == Q.F32 else (*dims[:-1], dims[-1] // block * size)  # bytes per row
        dtype = np.dtype(np.float32 if qtype == Q.F32 else np.uint8)
        w.add_tensor_info(name, stored, dtype, int(np.prod(stored)) * dtype.itemsize, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, dims, qtype in tensors:
        if qtype == Q.F32:
            w.write_tensor_data(np.ones(dims, dtype=np.float32))
        else:
            w.write_tensor_data(_q4_0(rng, dims[0], dims[1], dims[1]))
    w.close()
    partial.rename(path)
    return path
