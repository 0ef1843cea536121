"""What llama.cpp computes in the first layer of two registered models, the reference of the
llama-cpp numerics' layer check (tests/test_llama_cpp_numerics.py).

The first 64 tokens of head40k (as llama-perplexity tokenizes it) go through llama.cpp (libllama
of llama-cpp-python 0.3.36, built for this CPU, its context as llama-perplexity sets it: a batch of
the 64 tokens, 2 threads, the default flash attention and float16 cache) and the output of its
first layer (the graph's `l_out-0`) is read through the graph's evaluation callback: float32
[64, hidden] per model. 64 tokens is the least for which ggml-cpu takes the tiled flash attention
llama-perplexity's 512-token chunks take.

`python -m tests.llama_cpp_layers` writes tests/data/llama-cpp-layers.npz anew.
"""
import ctypes
import os
import sys
import types

import numpy as np

from pipeline.gguf_io.registry import fetch_model
from pipeline.tools.llamacpp import llama_cpp_source, llama_library

from .ggml_reference import LLAMA_CPP_PYTHON, ggml
from .helpers import HEAD40K, REFERENCE

STORED = REFERENCE / "llama-cpp-layers.npz"
MODELS = ("smollm2-135m", "gemma3-270m")
TOKENS = 64


def read() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{model: (tokens [TOKENS] int32, llama.cpp's first-layer output [TOKENS, hidden] float32)}."""
    with np.load(STORED) as f:
        return {m: (f[f"{m}.tokens"], f[f"{m}.l_out-0"]) for m in MODELS}


def bindings():
    """The sdist's llama_cpp.llama_cpp (ctypes bindings) over the library built here (libggml-base
    beside it, which ggml_reference loads); its package's __init__, which needs the high-level API's
    dependencies, is not run."""
    library = llama_library(LLAMA_CPP_PYTHON)
    package = types.ModuleType("llama_cpp")
    package.__path__ = [str(llama_cpp_source(LLAMA_CPP_PYTHON).parents[1] / "llama_cpp")]
    sys.modules.setdefault("llama_cpp", package)
    os.environ["LLAMA_CPP_LIB_PATH"] = str(library.parent)
    import llama_cpp.llama_cpp as llama
    return llama


def first_layer_output(model: str, tokens: np.ndarray) -> np.ndarray:
    """llama.cpp's `l_out-0` [len(tokens), hidden] float32 of the registered `model` over `tokens`,
    decoded as one batch at positions 0 ..."""
    llama, base = bindings(), ggml()
    base.ggml_get_name.restype, base.ggml_get_name.argtypes = ctypes.c_char_p, [ctypes.c_void_p]
    base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [ctypes.c_void_p]
    base.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
    found = {}

    @llama.ggml_backend_sched_eval_callback
    def callback(tensor, ask, _):
        if base.ggml_get_name(tensor) != b"l_out-0":
            return not ask   # asked: not wanted; computed: go on
        if not ask:
            out = np.empty(base.ggml_nbytes(tensor) // 4, np.float32)
            base.ggml_backend_tensor_get(tensor, out.ctypes.data, 0, out.nbytes)
            found["l_out-0"] = out.reshape(len(tokens), -1)
        return True

    llama.llama_backend_init()
    loaded = llama.llama_model_load_from_file(str(fetch_model(model)).encode(), llama.llama_model_default_params())
    params = llama.llama_context_default_params()
    params.n_ctx = params.n_batch = params.n_ubatch = len(tokens)
    params.n_threads = params.n_threads_batch = 2
    params.cb_eval = callback
    context = llama.llama_init_from_model(loaded, params)
    batch = llama.llama_batch_init(len(tokens), 0, 1)
    for i, token in enumerate(tokens.tolist()):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, i == len(tokens) - 1
        batch.seq_id[i][0] = 0
    batch.n_tokens = len(tokens)
    if llama.llama_decode(context, batch):
        raise RuntimeError(f"llama.cpp could not decode {model}'s tokens")
    llama.llama_batch_free(batch)
    llama.llama_free(context)
    llama.llama_model_free(loaded)
    return found["l_out-0"]


def main() -> None:
    from pipeline.gguf_io.reader import open_gguf
    from pipeline.gguf_io.tokenizer import load_tokenizer

    text = HEAD40K.read_text(encoding="utf-8")
    entries = {}
    for model in MODELS:
        tokens = np.array(load_tokenizer(open_gguf(fetch_model(model))).encode(text)[:TOKENS], dtype=np.int32)
        entries[f"{model}.tokens"] = tokens
        entries[f"{model}.l_out-0"] = first_layer_output(model, tokens)
    np.savez_compressed(STORED, **entries)
    print(f"wrote {STORED}: " + ", ".join(f"{k} {v.shape}" for k, v in entries.items()))


if __name__ == "__main__":
    main()
