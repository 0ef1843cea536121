"""Logits of a real model equal Hugging Face transformers loading the same GGUF (float32): Gemma-3,
the registered family with the most forms (sliding windows, two RoPE bases, its norms; every
family's tiny member is compared with transformers in tests/test_architectures.py).

Tolerance: both sides compute the same float32 math over the same dequantized weights, so
they differ only by rounding order (attention kernels, GEMM blocking) accumulated over the
layers: measured at most 2e-4 on logits of magnitude 30-45. 1e-3 leaves a 5x margin while a
real mistake (RoPE pairing, a missing norm or scale, a wrong window) moves logits by > 0.1.
"""
import torch

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import load_tokenizer
from pipeline.model.arch import load_architecture
from pipeline.model.executor import WindowExecutor

from .helpers import HEAD40K

ATOL = 1e-3
N_TOKENS = 300


def test_logits_match_transformers(model_path):
    from transformers import AutoModelForCausalLM

    path = model_path("gemma3-270m")
    index = GGUFIndex(path)
    arch = load_architecture(index)
    ids = torch.tensor([load_tokenizer(index).encode(HEAD40K.read_text(encoding="utf-8")[:4000])[:N_TOKENS]])
    with torch.inference_mode():
        hidden = WindowExecutor(arch, 0, arch.hp.n_layers, "cpu", torch.float32)(arch.embed(ids, "cpu", torch.float32))
        ours = arch.load_head("cpu", torch.float32)(hidden[0])
        ref_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        ref = ref_model(ids).logits[0]
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < ATOL
    assert (ours.argmax(-1) == ref.argmax(-1)).all()
