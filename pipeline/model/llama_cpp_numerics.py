"""`--numerics llama-cpp`: what llama-perplexity computes on the CPU by default, emulated around the
families' own layers (the default, `exact`, is the model's math on its dequantized weights).

Three things differ, and each is emulated where it happens:
- products: a weight read from the file is held as a GGMLWeight, which quantizes the activations
  of every F.linear it takes part in to its type's vec_dot_type (gguf_io/activation_quants.py);
- the KV cache: keys (after RoPE) and values are stored in float16 (llama-perplexity's default
  `-ctk f16 -ctv f16`); its CPU flash attention (on by default, `-fa auto`) then computes in
  float32 from them, its queries unrounded (ggml-cpu's tiled flash_attn_ext);
- GELU: ggml-cpu reads it from a float16 table (GGML_GELU_FP16).
Where llama.cpp's graph computes a layer otherwise than the exact mode does, the family follows it
in this mode: latent attention absorbed over split attn_k_b and attn_v_b (arch/deepseek2.py),
Grok's attention without flash attention (arch/grok.py). The tiled flash attention emulated here
is the kernel ggml-cpu takes for a batch of 64 tokens or more.

The mode is set for the process by each task that computes (pipeline/numerics.py's `set_numerics`),
before it reads layers; a family whose layers have not been checked against llama-perplexity in it
is refused.
"""
import numpy as np
import torch
import torch.nn.functional as F

from ..gguf_io.activation_quants import VEC_DOT_TYPE, block_mins, input_product, product, product_input
from ..gguf_io.ggml_types import GGMLType
from ..numerics import emulating


def as_read(t: torch.Tensor, raw: np.ndarray, qtype: GGMLType) -> torch.Tensor:
    """A weight dequantized from `raw` (the file's uint8 rows) of `qtype`, as the products take it:
    in llama-cpp numerics a GGMLWeight (an F32 tensor as it is: ggml multiplies it in float32)."""
    if not emulating() or t.dim() < 2 or qtype.name not in VEC_DOT_TYPE:   # integer tables are looked up
        return t
    dot_type = VEC_DOT_TYPE[qtype.name]
    if dot_type == "F32":
        return t
    mins = block_mins(raw, qtype)
    return GGMLWeight(t, dot_type, None if mins is None else mins.to(t.device))


def shared_input(x: torch.Tensor, *weights: torch.Tensor):
    """linear(w, b) -> F.linear(x, w, b) for weights that take one input (q, k and v; gate and up).
    In llama-cpp numerics, where they are weights of one dot type, x is quantized for them once:
    ggml quantizes it for each product alike, so the products are the same, at a third or half the
    quantizing (the quantized copy is held while `linear` is)."""
    if rows := shared_rows(x, *weights):
        return rows(slice(None))
    return lambda w, b=None: F.linear(x, w, b)


def shared_rows(x: torch.Tensor, *weights: torch.Tensor):
    """In llama-cpp numerics, where `weights` are of one dot type: rows(index) -> linear(w, b), the
    product of x[index] [n, K] with w [N, K], x quantized once for all of them (as ggml's expert
    products quantize a token's input once for every expert it is routed to); else None."""
    one_type = all(isinstance(w, GGMLWeight) for w in weights) and len({w.dot_type for w in weights}) == 1
    if not (emulating() and one_type):
        return None
    values, sum_error = product_input(x, weights[0].dot_type)          # [N, K], [N, K/32] or None

    def rows(index):
        v, e = values[index], None if sum_error is None else sum_error[index]
        return lambda w, b=None: input_product(v, e, plain_values(w), plain_values(b), w.mins)
    return rows


def kv_cached(t: torch.Tensor) -> torch.Tensor:
    """Keys or values as attention reads them from the cache: in llama-cpp numerics rounded to float16."""
    return t.to(torch.float16).to(t.dtype) if emulating() else t


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """GELU's tanh form; in llama-cpp numerics as ggml-cpu's float16 table gives it: of x rounded to
    float16, the result rounded to float16, 0 below -10 and x above 10."""
    if not emulating():
        return F.gelu(x, approximate="tanh")
    table = F.gelu(x.half().float(), approximate="tanh").half().float()
    return torch.where(x <= -10, 0.0, torch.where(x >= 10, x.float(), table)).to(x.dtype)


def plain_values(t):
    """A weight a layer uses as values rather than in a product (ggml casts it to float32 first,
    as qwen4exp's n-gram convolution kernel): the tensor without its emulation."""
    return t.as_subclass(torch.Tensor) if isinstance(t, GGMLWeight) else t


# ops that take rows (or experts) of a weight, each row whole: the result is a weight of the same type
ROW_VIEWS = {torch.Tensor.__getitem__, torch.Tensor.chunk, torch.chunk, torch.Tensor.split, torch.split,
             torch.Tensor.unbind, torch.unbind, torch.Tensor.select, torch.select, torch.Tensor.narrow, torch.narrow}
# ops that give the weight's own values: the result is the weight
SAME_VALUES = {torch.Tensor.contiguous, torch.Tensor.detach, torch.Tensor.float}


def _holds_tensor(out) -> bool:
    return isinstance(out, torch.Tensor) or (isinstance(out, (tuple, list)) and any(map(_holds_tensor, out)))


class GGMLWeight(torch.Tensor):
    """A weight [..., N, K] as ggml-cpu's products take it: F.linear(x, w) quantizes x for the
    weight type's `dot_type` (block `mins` [..., N, K/32] of a Q4_1 or Q5_1 weight go with it).
    Taking rows or experts keeps that; any other op that makes a tensor of it (another product,
    a transpose, arithmetic) is refused, as llama.cpp multiplies a quantized weight and does
    nothing else with it; what describes it (shape, dtype, bytes) is answered."""

    @staticmethod
    def __new__(cls, data: torch.Tensor, dot_type: str, mins: torch.Tensor | None):
        w = data.as_subclass(cls)
        w.dot_type, w.mins = dot_type, mins
        return w

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear:
            x, w, bias = (*args, None)[:3] if len(args) >= 2 else (args[0], kwargs["weight"], None)
            bias = kwargs.get("bias", bias)
            if isinstance(w, GGMLWeight) and not isinstance(x, GGMLWeight):
                return product(x, plain_values(w), plain_values(bias), w.dot_type, w.mins)
        with torch._C.DisableTorchFunctionSubclass():
            out = func(*map(plain_values, args), **{k: plain_values(v) for k, v in kwargs.items()})
        if args and isinstance(args[0], GGMLWeight) and func in ROW_VIEWS:
            return args[0].rows_of(func, out, args[1:], kwargs)
        if args and isinstance(args[0], GGMLWeight) and func in SAME_VALUES:
            return GGMLWeight(out, args[0].dot_type, args[0].mins)
        if _holds_tensor(out):
            raise NotImplementedError(f"{getattr(func, '__name__', func)} of a weight is not emulated in llama-cpp "
                                      f"numerics")
        return out

    def rows_of(self, func, out, args, kwargs):
        """The weight(s) `out` that func(self, *args) took, each with its blocks' minima taken alike."""
        whole = isinstance(out, torch.Tensor)
        parts = [out] if whole else list(out)
        if any(p.dim() < 2 or p.shape[-1] != self.shape[-1] for p in parts):
            raise NotImplementedError(f"{func.__name__} across a weight's rows is not emulated in llama-cpp numerics")
        mins = [None] * len(parts) if self.mins is None else func(self.mins, *args, **kwargs)
        mins = [mins] if whole and self.mins is not None else list(mins)
        made = [GGMLWeight(p, self.dot_type, m) for p, m in zip(parts, mins, strict=True)]
        return made[0] if whole else type(out)(made)
