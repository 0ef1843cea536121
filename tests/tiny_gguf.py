"""A tiny llama-shaped GGUF written with gguf-py, for inputs no real model gives."""
import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, quants

HIDDEN, FFN, VOCAB = 32, 64, 64


def write_tiny_gguf(path, arch: str = "llama", ffn_up_type: GGMLQuantizationType = GGMLQuantizationType.F32):
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(2)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"t{i}" for i in range(VOCAB)])
    shapes = {"token_embd.weight": (VOCAB, HIDDEN), "output_norm.weight": (HIDDEN,),
              "blk.0.attn_norm.weight": (HIDDEN,), "blk.0.ffn_norm.weight": (HIDDEN,),
              **{f"blk.0.attn_{k}.weight": (HIDDEN, HIDDEN) for k in ("q", "k", "v", "output")},
              "blk.0.ffn_gate.weight": (FFN, HIDDEN), "blk.0.ffn_up.weight": (FFN, HIDDEN),
              "blk.0.ffn_down.weight": (HIDDEN, FFN)}
    for name, shape in shapes.items():
        data = rng.standard_normal(shape).astype(np.float32)
        if name == "blk.0.ffn_up.weight" and ffn_up_type != GGMLQuantizationType.F32:
            block, type_size = quants.GGML_QUANT_SIZES[ffn_up_type]
            raw = rng.integers(0, 256, (shape[0], shape[1] // block * type_size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_shape=raw.shape, raw_dtype=ffn_up_type)
        else:
            w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def rewrite_gguf(src, dst, transform=None, metadata: dict | None = None, extra: dict | None = None, **split):
    """Copy a GGUF with each tensor replaced by transform(name, qtype, data) -> (data, qtype),
    (data, qtype, new name) or None to leave it out (data as gguf-py's reader holds it; no
    transform: unchanged), the tensors of `extra` (name -> (data, qtype)) added, and the
    metadata keys in `metadata` set to their values (None: removed; a new key's type follows the
    Python value's). `split`: gguf-py's writer options that write it in parts
    (`split_max_tensors`, `split_max_size`, `small_first_shard`)."""
    from gguf import GGUFReader, GGUFValueType

    metadata = dict(metadata or {})

    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch, **split)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        value = metadata.pop(name, field.contents())
        if value is not None:
            w.add_key_value(name, value, vtype, sub_type=sub)
    for name, value in metadata.items():
        if value is not None:
            w.add_key_value(name, value, GGUFValueType.get_type(value))
    for t in reader.tensors:
        # transform may also drop a tensor (None) or give it another name (a third element)
        new = (transform or (lambda n, q, d: (d, q)))(t.name, t.tensor_type, np.asarray(t.data))
        if new is not None:
            data, qtype, name = (*new, t.name)[:3]
            w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    for name, (data, qtype) in (extra or {}).items():
        w.add_tensor(name, data, raw_shape=data.shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst
