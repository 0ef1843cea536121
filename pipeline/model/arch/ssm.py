"""The state-space mixers: the causal depthwise conv1d; Mamba-1's selective scan (a decay per
channel and state entry) and Mamba2's (state-space duality: one per head), each in blockwise form
and step by step; and the mixers that wire them as llama.cpp's `build_mamba_layer` and
`build_mamba2_layer` do.

Recurrent state lives in a dict the caller may pass (keys "conv", "ssm"); without one every
batch row starts from zeros, which is what a pass over independent sequences needs.
Scans run in float32 (or wider) whatever the compute dtype.
"""
import torch
import torch.nn.functional as F
from gguf import MODEL_TENSOR as MT
from gguf import Keys

from .blocks import rms_norm, wide
from .recurrent import RecurrentMixer

SCAN_BLOCK = 64
# a Mamba-1 block's [positions, channels, state] float32 tensors stay under this per sequence; its
# positions depend on the layer's width only, never on the batch or the context
SELECTIVE_SCAN_BLOCK_BYTES = 16 * 2 ** 20
SELECTIVE_SCAN_TENSORS = 4   # such tensors alive at once: decays, states, and a doubling step's two products
# held in float32 whatever the compute dtype: the decay A, the skip D and dt's bias enter the scan,
# which runs in float32
SSM_FLOAT32_TENSORS = (".ssm_a", ".ssm_d", "ssm_dt.bias")


def causal_conv1d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution. x [B, T, C], weight [C, K], state [B, K-1, C] (the inputs
    before x; zeros if None) -> y [B, T, C], new state [B, K-1, C]."""
    B, T, C = x.shape
    K = weight.shape[1]
    if state is None:
        state = x.new_zeros(B, K - 1, C)
    padded = torch.cat([state.to(x.dtype), x], dim=1)                        # [B, K-1+T, C]
    y = F.conv1d(padded.transpose(1, 2), weight.unsqueeze(1), bias, groups=C)  # [B, C, T]
    return y.transpose(1, 2), padded[:, T:]


def selective_scan_reference(x, dt, A, B, C, state=None):
    """Mamba-1's scan step by step, h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t, y_t = h_t C_t, with a
    decay per channel and state entry.

    x and dt [b, T, d] (dt after softplus), A [d, n], B and C [b, T, n], state [b, d, n] ->
    y [b, T, d], final state."""
    b, T, d = x.shape
    s = x.new_zeros(b, d, A.shape[1]) if state is None else state
    ys = []
    for t in range(T):
        s = s * torch.exp(dt[:, t, :, None] * A) + (dt[:, t] * x[:, t])[..., None] * B[:, t, None, :]
        ys.append(torch.einsum("bdn,bn->bd", s, C[:, t]))
    return torch.stack(ys, dim=1), s


def selective_scan_block(d: int, n: int) -> int:
    """Positions per block of Mamba-1's blockwise scan over d channels of n state entries."""
    return max(1, min(SCAN_BLOCK, SELECTIVE_SCAN_BLOCK_BYTES // (4 * d * n)))


def selective_scan_blockwise(x, dt, A, B, C, state=None, block: int | None = None):
    """The same scan in blocks of `block` positions (selective_scan_block's by default): inside a
    block, a parallel prefix scan (Hillis-Steele: log2 L doubling steps, each combining position t
    with t - step, products of decays that stay in [0, 1]); the state passed between blocks.
    Shapes as `selective_scan_reference`; below, L positions of a block."""
    b, T, d = x.shape
    block = block or selective_scan_block(d, A.shape[1])
    s = x.new_zeros(b, d, A.shape[1]) if state is None else state
    ys = []
    for a in range(0, T, block):
        dt_b, x_b, B_b, C_b = (m[:, a:a + block] for m in (dt, x, B, C))     # [b, L, d] or [b, L, n]
        decay = torch.exp(dt_b[..., None] * A)                                 # [b, L, d, n]
        h = (dt_b * x_b)[..., None] * B_b[:, :, None, :]                       # [b, L, d, n]
        step = 1
        while step < h.shape[1]:   # decay_t: the product of the decays of (t - 2 step, t]; h_t: their sum
            h[:, step:] += decay[:, step:] * h[:, :-step]
            decay[:, step:] = decay[:, step:] * decay[:, :-step]
            step *= 2
        h += decay * s[:, None]                                                # the entering state, decayed
        ys.append(torch.einsum("bldn,bln->bld", h, C_b))
        s = h[:, -1].clone()                                                   # frees the block
    return torch.cat(ys, dim=1), s


def selective_scan_bytes(batch: int, d: int, n: int) -> int:
    """What selective_scan_blockwise holds beyond the per-token activations: its block's tensors."""
    return SELECTIVE_SCAN_TENSORS * 4 * batch * selective_scan_block(d, n) * d * n


def ssd_reference(x, dt, A, B, C, state=None):
    """Step-by-step selective scan, h_t = exp(dt_t A) h_{t-1} + dt_t x_t B_t^T, y_t = h_t C_t.

    x [b, T, h, p], dt [b, T, h] (after softplus), A [h], B and C [b, T, g, n] (g groups, each
    shared by h/g consecutive heads), state [b, h, p, n] -> y [b, T, h, p], final state."""
    b, T, h, p = x.shape
    B, C = (m.repeat_interleave(h // m.shape[2], dim=2) for m in (B, C))      # [b, T, h, n]
    s = x.new_zeros(b, h, p, B.shape[-1]) if state is None else state
    ys = []
    for t in range(T):
        decay = torch.exp(dt[:, t] * A)                                       # [b, h]
        s = s * decay[..., None, None] + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]
        ys.append(torch.einsum("bhpn,bhn->bhp", s, C[:, t]))
    return torch.stack(ys, dim=1), s


def _segsum(a: torch.Tensor) -> torch.Tensor:
    """a [..., L] -> [..., L, L] with out[i, j] = a[j+1] + ... + a[i] for j <= i, -inf above."""
    L = a.shape[-1]
    rep = a[..., None].expand(*a.shape, L)                                    # rep[i, j] = a[i]
    rep = rep.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool, device=a.device), -1), 0)
    seg = torch.cumsum(rep, dim=-2)
    return seg.masked_fill(~torch.tril(torch.ones(L, L, dtype=torch.bool, device=a.device)), float("-inf"))


def ssd_blockwise(x, dt, A, B, C, state=None, block: int = SCAN_BLOCK):
    """The same scan in blocks of `block` tokens: quadratic inside a block, a state passed
    between blocks (Mamba2's SSD algorithm). Shapes as `ssd_reference`; below, c blocks of
    l = `block` positions.

    Every product is a batched GEMM over (sequence, block, group): the heads of a group share
    its B and C, so C B^T is formed once per group and the heads' values sit side by side in
    the GEMMs that meet B or C."""
    b, T, h, p = x.shape
    g, n = B.shape[-2:]
    r = h // g                                                                 # heads per group
    pad = (-T) % block
    if pad:  # zero steps: dt = 0 leaves the state untouched and adds nothing
        x, dt, B, C = (F.pad(t, (0,) * (2 * (t.dim() - 2)) + (0, pad)) for t in (x, dt, B, C))
    c = x.shape[1] // block
    X = x * dt[..., None]                                                      # [b, c*l, h, p]
    a = (dt * A).view(b, c, block, h).transpose(2, 3).contiguous()             # [b, c, h, l]
    a_cum = torch.cumsum(a, dim=-1)                                            # [b, c, h, l]
    Bg, Cg = (m.reshape(b, c, block, g, n).transpose(2, 3) for m in (B, C))    # [b, c, g, l, n]
    # within each block: y_i = sum_{j <= i} (C_i . B_j) exp(a_{j+1} + ... + a_i) X_j
    decay = torch.exp(_segsum(a)).view(b, c, g, r, block, block)               # [b, c, g, r, l, l]
    scores = (Cg @ Bg.transpose(-1, -2)).unsqueeze(3) * decay                  # [b, c, g, r, l, l]
    Xh = X.view(b, c, block, g, r, p).permute(0, 1, 3, 4, 2, 5)                # [b, c, g, r, l, p]
    y = scores @ Xh                                                            # [b, c, g, r, l, p]
    # the state each block leaves behind: sum_j exp(a_{j+1} + ... + a_end) X_j B_j^T
    to_end = torch.exp(a_cum[..., -1:] - a_cum).view(b, c, g, r, block, 1)     # [b, c, g, r, l, 1]
    Xg = (Xh * to_end).permute(0, 1, 2, 3, 5, 4).reshape(b, c, g, r * p, block)  # [b, c, g, r*p, l]
    left = (Xg @ Bg).view(b, c, h, p, n)                                       # [b, c, h, p, n]
    # carried across blocks: the state entering each block, and the one after the last
    block_decay = torch.exp(a_cum[..., -1])[..., None, None]                   # [b, c, h, 1, 1]
    entering = torch.empty_like(left)                                          # [b, c, h, p, n]
    entering[:, 0] = 0 if state is None else state
    for k in range(c - 1):
        torch.addcmul(left[:, k], entering[:, k], block_decay[:, k], out=entering[:, k + 1])
    final = torch.addcmul(left[:, -1], entering[:, -1], block_decay[:, -1])    # [b, h, p, n]
    # what the entering state adds at each position of its block: exp(a_1 + ... + a_i) C_i S
    from_state = Cg @ entering.view(b, c, g, r * p, n).transpose(-1, -2)       # [b, c, g, l, r*p]
    from_state = from_state.view(b, c, g, block, r, p).transpose(3, 4)         # [b, c, g, r, l, p]
    y = y + from_state * torch.exp(a_cum).view(b, c, g, r, block, 1)
    return y.view(b, c, h, block, p).transpose(2, 3).reshape(b, c * block, h, p)[:, :T], final


class Mamba1(RecurrentMixer):
    """in_proj -> (x, z); conv1d + SiLU on x; x_proj -> (dt, B, C), each RMS-normed where `normed`
    (by its weight where the block has one); dt_proj + bias; scan; + D x; * SiLU(z); out_proj."""

    def __init__(self, w: dict[str, torch.Tensor | None], normed: bool, eps: float):
        super().__init__(w)
        self.normed, self.eps = normed, eps

    def describe(self) -> str:
        return f"dt, B and C RMS-normed: {self.normed}"

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        # x: [B, T, hidden]
        w = self.w
        d, n = w["A"].shape                                                    # inner width, state size
        xs, z = F.linear(x, w["in"]).split([d, d], dim=-1)                   # [B, T, d] each
        xs, conv_state = causal_conv1d(xs, w["conv"], w["conv_bias"], (state or {}).get("conv"))
        xs = F.silu(xs)
        dt, Bm, Cm = F.linear(xs, w["x"]).split([w["dt"].shape[1], n, n], dim=-1)   # dt: [B, T, dt rank]
        if self.normed:
            dt, Bm, Cm = (rms_norm(m, w.get(k), self.eps) for m, k in ((dt, "dt_norm"), (Bm, "B_norm"), (Cm, "C_norm")))
        dt = F.softplus(wide(F.linear(dt, w["dt"])) + w["dt_bias"])           # [B, T, d]
        y, ssm_state = selective_scan_blockwise(wide(xs), dt, w["A"], wide(Bm), wide(Cm), (state or {}).get("ssm"))
        y = (y + wide(xs) * w["D"]) * F.silu(wide(z))
        if state is not None:
            state["conv"], state["ssm"] = conv_state, ssm_state
        return F.linear(y.to(x.dtype), w["out"])


def read_mamba(arch, t, norm_weights: bool) -> Mamba1:
    """A Mamba-1 mixer of family `arch` from block tensors `t` (loading.BlockTensors), as llama.cpp's
    llm_build_mamba_base reads it: dt, B and C RMS-normed by the block's weights (`norm_weights`:
    Jamba's), or without weights where the file sets ssm.dt_b_c_rms (Falcon-Mamba's)."""
    w = {"in": t(MT.SSM_IN), "conv": t(MT.SSM_CONV1D), "conv_bias": t(MT.SSM_CONV1D, "bias"), "x": t(MT.SSM_X),
         "dt": t(MT.SSM_DT), "dt_bias": t(MT.SSM_DT, "bias"), "A": t(MT.SSM_A, None), "D": t(MT.SSM_D, None),
         "out": t(MT.SSM_OUT)}
    if norm_weights:
        w |= {"dt_norm": t(MT.SSM_DT_NORM), "B_norm": t(MT.SSM_B_NORM), "C_norm": t(MT.SSM_C_NORM)}
    normed = norm_weights or bool(arch.key(Keys.SSM.DT_B_C_RMS, False))
    return Mamba1(w, normed, arch.hp.eps)


class Mamba2(RecurrentMixer):
    """in_proj -> (z, xBC, dt); conv1d + SiLU on xBC; scan; + D x; * SiLU(z); grouped RMSNorm; out_proj."""

    def __init__(self, w: dict[str, torch.Tensor | None], n_head: int, n_group: int, d_state: int, eps: float):
        super().__init__(w)
        self.n_head, self.n_group, self.d_state, self.eps = n_head, n_group, d_state, eps
        self.d_inner = w["out"].shape[1]

    def describe(self) -> str:
        return f"heads={self.n_head}, groups={self.n_group}, d_state={self.d_state}, d_inner={self.d_inner}"

    def scan(self, x: torch.Tensor, tables=None, state: dict | None = None) -> torch.Tensor:
        # x: [B, T, hidden]
        w, h, g, n, d = self.w, self.n_head, self.n_group, self.d_state, self.d_inner
        Bsz, T, _ = x.shape
        zxbcdt = F.linear(x, w["in"])
        z, xbc, dt = zxbcdt.split([d, d + 2 * g * n, h], dim=-1)
        xbc, conv_state = causal_conv1d(xbc, w["conv"], w.get("conv_bias"), (state or {}).get("conv"))
        xbc = wide(F.silu(xbc))
        xs, Bm, Cm = xbc.split([d, g * n, g * n], dim=-1)
        xs = xs.view(Bsz, T, h, d // h)
        Bm, Cm = (m.view(Bsz, T, g, n) for m in (Bm, Cm))                   # [B, T, g, n]
        dt = F.softplus(wide(dt) + wide(w["dt_bias"]))                       # [B, T, h]
        y, ssm_state = ssd_blockwise(xs, dt, wide(w["A"]).view(h), Bm, Cm, (state or {}).get("ssm"))
        y = y + xs * wide(w["D"]).view(h, 1)
        y = (y.reshape(Bsz, T, d) * F.silu(wide(z))).view(Bsz, T, g, d // g)
        if "norm" in w:                                                     # grouped RMSNorm (Falcon-H1 may have none)
            y = rms_norm(y, wide(w["norm"]), self.eps)
        y = y.reshape(Bsz, T, d).to(x.dtype)
        if state is not None:
            state["conv"], state["ssm"] = conv_state, ssm_state
        return F.linear(y, w["out"])


def read_mamba2(arch, t, norm_required: bool = True) -> Mamba2:
    """A Mamba2 mixer of family `arch` from block tensors `t` (loading.BlockTensors), as llama.cpp's
    llm_build_mamba_base reads it for every family that has one; the grouped norm after the gate
    where the family requires it or the file has it."""
    w = {"in": t(MT.SSM_IN), "conv": t(MT.SSM_CONV1D), "conv_bias": t(MT.SSM_CONV1D, "bias", required=False),
         "dt_bias": t(MT.SSM_DT, "bias"), "A": t(MT.SSM_A, None), "D": t(MT.SSM_D, None),
         "norm": t(MT.SSM_NORM, required=norm_required), "out": t(MT.SSM_OUT)}
    return Mamba2(w, n_head=int(arch.key(Keys.SSM.TIME_STEP_RANK)), n_group=int(arch.key(Keys.SSM.GROUP_COUNT)),
                  d_state=int(arch.key(Keys.SSM.STATE_SIZE)), eps=arch.hp.eps)
