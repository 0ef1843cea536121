"""Fused tensors are split into views and give the bit-identical result of the same model
unfused: Q/K/V fused into attn_qkv and the experts' gate and up fused into ffn_gate_up_exps by
llama.cpp's converter (Qwen3-Next), and Q/K/V fused in a llama file."""
import numpy as np
import torch
from gguf import GGMLQuantizationType

from pipeline.gguf_io.reader import GGUFIndex

from .helpers import forward, random_ids
from .tiny_gguf import rewrite_gguf


def test_converter_fused_qkv_and_gate_up_experts_give_the_unfused_result(tiny_model):
    _, plain = tiny_model("qwen3next")
    _, fused = tiny_model("qwen3next_fused")
    names = set(GGUFIndex(fused).tensors)
    assert "blk.2.attn_qkv.weight" in names and "blk.2.attn_q.weight" not in names   # layer 2 attends
    assert "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_up_exps.weight" not in names
    ids = random_ids()
    assert torch.equal(forward(fused, ids), forward(plain, ids))


def test_llama_qkv_fused_gives_the_unfused_result(model_path, tmp_path):
    src = model_path("smollm2-135m")
    parts = {}

    def fuse(name, qtype, data):
        # Q4_1 rows are independent blocks: the fused tensor is the three tensors' rows stacked
        for kind in ("q", "k", "v"):
            if name.endswith(f".attn_{kind}.weight"):
                layer = name.split(".")[1]
                parts.setdefault(layer, {})[kind] = (data, qtype)
                if len(parts[layer]) < 3:
                    return None
                datas = [parts[layer][k][0] for k in ("q", "k", "v")]
                return np.concatenate(datas), qtype, f"blk.{layer}.attn_qkv.weight"
        return data, qtype

    fused = rewrite_gguf(src, tmp_path / "fused.gguf", fuse)
    assert "blk.0.attn_qkv.weight" in GGUFIndex(fused).tensors
    assert GGUFIndex(fused).tensors["blk.0.attn_qkv.weight"].qtype == GGMLQuantizationType.Q4_1
    ids = torch.randint(0, 49152, (1, 96), generator=torch.Generator().manual_seed(0))
    assert torch.equal(forward(fused, ids), forward(src, ids))
