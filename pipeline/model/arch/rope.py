"""Rotary position embedding as llama.cpp computes it (ggml's rope with freq_scale, ext_factor
and attn_factor): plain, linearly scaled, or YaRN-extended; and what a file's metadata says
of it (`read_rope`), which is honoured or refused in one line.

YaRN (ggml_rope_yarn): for rotation pair k, theta_extrap = pos * base^(-2k/dim) / factor_k and
theta_interp = theta_extrap / scale; they are mixed by a ramp that is 1 below the correction
dim `low` and 0 above `high` (floored and ceiled as ggml does), and cos/sin are multiplied by
mscale = attn_factor * (1 + 0.1 ln scale). llama.cpp sets attn_factor so that the product is
the YaRN paper's 1 + 0.1 ln(scale), times `rope.scaling.attn_factor`; a family that reads
`rope.scaling.yarn_log_mul` (mscale_all_dim) has it divided by 1 + 0.1 mscale_all_dim ln(scale).
"""
import math
from dataclasses import dataclass

import torch
from gguf import Keys

from ...errors import UserError
from ...numerics import emulating

SCALE_LINEAR = "{arch}.rope.scale_linear"   # the older name of rope.scaling.factor, still read by llama.cpp
# what llama.cpp's llama/qwen/gemma/nemotron loaders use for YaRN: they read none of the
# rope.scaling.yarn_* keys, so a file that sets one to another value says something llama.cpp
# does not compute
YARN_DEFAULTS = {Keys.Rope.SCALING_YARN_EXT_FACTOR: 1.0, Keys.Rope.SCALING_YARN_BETA_FAST: 32.0,
                 Keys.Rope.SCALING_YARN_BETA_SLOW: 1.0, Keys.Rope.SCALING_YARN_LOG_MUL: 0.0}


@dataclass(frozen=True)
class Yarn:
    n_ctx_orig: int           # the context the model was trained at (ramp's correction dims)
    attn_factor: float        # llama.cpp's yarn_attn_factor, before ggml's 1 + 0.1 ln(scale)
    ext_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0


@dataclass(frozen=True)
class RopeSpec:
    dim: int                 # rotated width of each head (<= head_dim)
    base: float
    neox: bool               # pairs half the width apart (True) or consecutive pairs (False)
    scale: float = 1.0       # positions divided by it (linear scaling, YaRN's interpolation)
    freq_factors: tuple[float, ...] | None = None  # Llama-3 `rope_freqs`: frequencies divided by them
    mscale: float = 1.0      # cos and sin multiplied by it (rope.scaling.attn_factor), without YaRN
    yarn: Yarn | None = None
    unrotated: tuple[int, ...] = ()   # rotation pairs whose angle is 0 (multi-axis RoPE's fourth axis, for text)
    # LongRoPE (Phi-3): these factors instead of freq_factors for a context longer than long_after
    long_factors: tuple[float, ...] | None = None
    long_after: int = 0


CONTEXT_PAD = 256   # llama.cpp rounds a sequence's context up to this before comparing it (n_ctx_seq)


def frequency_factors(spec: RopeSpec, n_pos: int) -> tuple[float, ...] | None:
    """The factors that divide the frequencies for sequences of n_pos tokens: LongRoPE's long ones
    where llama.cpp's context per sequence (n_pos rounded up to CONTEXT_PAD) passes long_after."""
    if spec.long_factors is not None and -(-n_pos // CONTEXT_PAD) * CONTEXT_PAD > spec.long_after:
        return spec.long_factors
    return spec.freq_factors


def text_unrotated_pairs(sections: list[int], n_pairs: int, interleaved: bool) -> tuple[int, ...]:
    """Multi-axis RoPE over text, as ggml_rope_multi computes it: llama.cpp gives a text token its
    position on the first three axes (t, h, w: the same angle, whichever) and 0 on the fourth,
    so a pair that ggml assigns to the fourth axis is not rotated. Pairs are assigned by
    sector = pair mod sum(sections): consecutive blocks of the sections, or (interleaved,
    Qwen3-VL) t, h, w in turn while each axis has sections left."""
    s0, s1, s2, s3 = (list(sections) + [0, 0, 0, 0])[:4]
    out = []
    for pair in range(n_pairs):
        sector = pair % (s0 + s1 + s2 + s3)
        if interleaved:
            fourth = not any(sector % 3 == axis and sector < 3 * size for axis, size in enumerate((s0, s1, s2)))
        else:
            fourth = sector >= s0 + s1 + s2
        if fourth:
            out.append(pair)
    return tuple(out)


def yarn_corr_dims(dim: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """ggml_rope_yarn_corr_dims: the rotation pairs where the ramp starts and ends."""
    def corr_dim(n_rot: float) -> float:
        return dim * math.log(n_ctx_orig / (n_rot * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(corr_dim(beta_fast))), min(dim - 1.0, math.ceil(corr_dim(beta_slow)))


def ggml_tables(spec: RopeSpec, n_pos: int, factors: tuple[float, ...] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n_pos, dim / 2] float32 as ggml-cpu's rope cache forms them, in float32 throughout:
    each pair's angle the last one's times powf(base, -2 / dim), divided by its frequency factor (0
    for unrotated pairs); times freq_scale (1 / scale), blended with the unscaled angle along
    YaRN's ramp (rope_yarn); cosf and sinf of it times mscale."""
    f32 = torch.float32
    step = torch.tensor(spec.base, dtype=torch.float64).pow(-2.0 / spec.dim).float()
    theta = [torch.arange(n_pos, dtype=f32)]
    for _ in range(spec.dim // 2 - 1):
        theta.append(theta[-1] * step)
    extrap = torch.stack(theta, dim=1)                                                  # [n_pos, dim / 2]
    if factors is not None:
        extrap = extrap / torch.tensor(factors, dtype=f32)
    extrap[:, list(spec.unrotated)] = 0.0
    freq_scale = torch.tensor(1.0 / spec.scale, dtype=f32)
    angles = freq_scale * extrap
    mscale = torch.tensor(spec.mscale if spec.yarn is None else spec.yarn.attn_factor, dtype=f32)
    if spec.yarn is not None and spec.yarn.ext_factor:
        y = spec.yarn
        low, high = yarn_corr_dims(spec.dim, y.n_ctx_orig, spec.base, y.beta_fast, y.beta_slow)
        k = torch.arange(spec.dim // 2, dtype=f32)
        mix = (1 - ((k - low) / max(0.001, high - low)).clamp(0, 1)) * y.ext_factor          # [dim / 2]
        angles = angles * (1 - mix) + extrap * mix
        mscale = mscale * (1 + 0.1 * torch.log(1 / freq_scale))
    angles = angles.double()                                       # cosf and sinf: correctly rounded
    return angles.cos().float() * mscale, angles.sin().float() * mscale


def rope_tables(spec: RopeSpec, n_pos: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin of shape [n_pos, dim / 2], computed in float64 (in llama-cpp numerics as ggml-cpu
    computes them: ggml_tables)."""
    factors = frequency_factors(spec, n_pos)
    if emulating():
        return tuple(t.to(device, dtype) for t in ggml_tables(spec, n_pos, factors))
    inv = spec.base ** (-torch.arange(0, spec.dim, 2, dtype=torch.float64) / spec.dim)    # [dim / 2]
    if factors is not None:
        inv = inv / torch.tensor(factors, dtype=torch.float64)
    if spec.unrotated:
        inv[list(spec.unrotated)] = 0.0
    pos = torch.arange(n_pos, dtype=torch.float64)
    if spec.yarn is None:
        angles = torch.outer(pos / spec.scale, inv)
        mscale = spec.mscale
    else:
        y = spec.yarn
        extrap = torch.outer(pos, inv)
        interp = extrap / spec.scale
        low, high = yarn_corr_dims(spec.dim, y.n_ctx_orig, spec.base, y.beta_fast, y.beta_slow)
        k = torch.arange(spec.dim // 2, dtype=torch.float64)
        ramp = 1 - ((k - low) / max(0.001, high - low)).clamp(0, 1)                       # [dim / 2]
        mix = ramp * y.ext_factor
        angles = interp * (1 - mix) + extrap * mix
        mscale = y.attn_factor * (1 + 0.1 * math.log(spec.scale)) if y.ext_factor else y.attn_factor
    cos, sin = angles.cos(), angles.sin()
    if mscale != 1.0:
        cos, sin = cos * mscale, sin * mscale
    return cos.to(device, dtype), sin.to(device, dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, spec: RopeSpec) -> torch.Tensor:
    # x: [B, H, T, D]; cos, sin: [T, dim / 2]
    rot, rest = x[..., :spec.dim], x[..., spec.dim:]
    if spec.neox:
        a, b = rot.chunk(2, dim=-1)
    else:
        a, b = rot[..., 0::2], rot[..., 1::2]
    ra, rb = a * cos - b * sin, b * cos + a * sin
    rotated = torch.cat([ra, rb], dim=-1) if spec.neox else torch.stack([ra, rb], dim=-1).flatten(-2)
    return torch.cat([rotated, rest], dim=-1) if rest.shape[-1] else rotated


def read_rope(arch, dim: int, neox: bool, freq_factors: tuple[float, ...] | None) -> RopeSpec:
    """The trunk's RoPE from the file's metadata, as llama.cpp's loader and context read it
    (llama-model.cpp, llama-context.cpp): a scaling type absent means linear, with the factor
    under either of its names (none given: no scaling)."""
    path, name = arch.gguf.path, lambda template: template.format(arch=arch.gguf.architecture)
    kind = str(arch.key(Keys.Rope.SCALING_TYPE, "linear"))
    factor = float(arch.key(Keys.Rope.SCALING_FACTOR, arch.gguf.arch_value(SCALE_LINEAR, 0.0)) or 0.0)
    attn_factor = float(arch.key(Keys.Rope.SCALING_ATTN_FACTOR, 1.0))
    base = float(arch.key(Keys.Rope.FREQ_BASE, 10000.0))
    if kind not in ("none", "linear", "yarn"):
        raise UserError(f"{path}: {name(Keys.Rope.SCALING_TYPE)} = {kind!r} is not computed by layercycle "
                        f"(none, linear and yarn are)")
    if not factor >= 0 or not attn_factor > 0:
        raise UserError(f"{path}: RoPE scaling factor {factor} / attention factor {attn_factor} must be positive")
    scale = 1.0 if kind == "none" or factor == 0 else factor
    if kind != "yarn":
        return RopeSpec(dim, base, neox, scale, freq_factors, mscale=attn_factor)
    for template, default in YARN_DEFAULTS.items():
        value = None if template in arch.honours else arch.gguf.arch_value(template)
        if value is not None and float(value) != default:
            raise UserError(f"{path}: {name(template)} = {float(value):g}, where llama.cpp computes this "
                            f"architecture's YaRN with {default:g}; layercycle does not guess which is meant")
    n_ctx_orig = int(arch.key(Keys.Rope.SCALING_ORIG_CTX_LEN, arch.hp.context_length))
    yarn_attn = context_yarn_attn_factor(scale, *arch.yarn_mscales()) * attn_factor
    mscale = get_mscale(scale, 1.0)
    # a family whose loader reads the key (grok) has llama.cpp's context overwrite it wherever YaRN extends
    declared = None if Keys.Rope.SCALING_YARN_ATTN_FACTOR in arch.honours else arch.gguf.arch_value(
        Keys.Rope.SCALING_YARN_ATTN_FACTOR)
    if declared is not None and not math.isclose(float(declared), mscale, rel_tol=1e-6):
        raise UserError(f"{path}: {name(Keys.Rope.SCALING_YARN_ATTN_FACTOR)} = {float(declared):g}, where llama.cpp "
                        f"scales this architecture's YaRN attention by {mscale:g}; layercycle does not guess which "
                        f"is meant")
    # the correction dims' betas, where the family reads them (else llama.cpp's defaults, checked above)
    return RopeSpec(dim, base, neox, scale, freq_factors, yarn=Yarn(n_ctx_orig, yarn_attn, **arch.yarn_betas()))


def get_mscale(scale: float, mscale: float) -> float:
    """YaRN's attention factor 1 + 0.1 mscale ln(scale) (1 where the scale does not extend)."""
    return 1.0 if scale <= 1 else 1 + 0.1 * mscale * math.log(scale)


def context_yarn_attn_factor(scale: float, mscale: float, mscale_all_dims: float) -> float:
    """llama-context.cpp's yarn_attn_factor before rope.scaling.attn_factor: get_mscale(scale),
    or get_mscale(scale, mscale) / get_mscale(scale, mscale_all_dims) where the file sets
    yarn_log_mul, divided by ggml's own 1 + 0.1 ln(scale), which ggml's rope multiplies back."""
    factor = get_mscale(scale, mscale) / get_mscale(scale, mscale_all_dims) if mscale_all_dims else get_mscale(scale, 1)
    return factor / (1 + 0.1 * math.log(scale))
