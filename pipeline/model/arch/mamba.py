"""mamba (Mamba-1: state-spaces' mamba-130m to 2.8b, Falcon-Mamba-7B): every layer one Mamba-1
mixer behind an RMSNorm and a residual, no attention and no feed-forward block; dt, B and C
RMS-normed without weights where the file sets ssm.dt_b_c_rms (Falcon-Mamba's), as llama.cpp's
build_mamba_layer computes it. llama.cpp takes an expansion of two only (ssm.inner_size = 2 x
embedding_length): another is refused, as its loader refuses it."""
from gguf import MODEL_TENSOR as MT
from gguf import TENSOR_NAMES, Keys
from torch import nn

from ...errors import UserError
from .family import FLOAT32_TENSORS, DecoderArch, LayerSpec
from .loading import BlockTensors
from .modules import OneBlockLayer
from .shapes import expect
from .ssm import SSM_FLOAT32_TENSORS, read_mamba, selective_scan_bytes


class MambaLayers:
    """A family with Mamba-1 layers (mixed in before DecoderArch): the keys llama.cpp requires for
    them and their tensors' shapes, checked when the file is opened; the scan's block, counted
    by the preflight."""
    float32_tensors = FLOAT32_TENSORS + SSM_FLOAT32_TENSORS
    scan_floats = 4.5      # 9 x its inner width, the scan's block apart (measured: tests/test_activation_memory.py)
    norm_weights = False   # dt, B and C normed by the block's ssm_dt_norm, ssm_b_norm, ssm_c_norm (Jamba's)

    def __init__(self, gguf):
        super().__init__(gguf)
        self.check_mamba_shapes()

    def check_mamba_shapes(self) -> None:
        H = self.hp.hidden
        conv, d, n, rank = (int(self.key(k)) for k in (Keys.SSM.CONV_KERNEL, Keys.SSM.INNER_SIZE, Keys.SSM.STATE_SIZE,
                                                        Keys.SSM.TIME_STEP_RANK))
        if d != 2 * H:
            raise UserError(f"{self.gguf.path}: ssm.inner_size {d} is not twice embedding_length {H}: llama.cpp "
                            f"computes Mamba with an expansion factor of 2 only")
        shapes = {(MT.SSM_IN, "weight"): ((2 * d, H), "2 x inner_size x embedding_length"),
                  (MT.SSM_CONV1D, "weight"): ((d, conv), "inner_size x conv_kernel"),
                  (MT.SSM_CONV1D, "bias"): ((d,), "inner_size"),
                  (MT.SSM_X, "weight"): ((rank + 2 * n, d), "time_step_rank + 2 x state_size x inner_size"),
                  (MT.SSM_DT, "weight"): ((d, rank), "inner_size x time_step_rank"),
                  (MT.SSM_DT, "bias"): ((d,), "inner_size"),
                  (MT.SSM_A, ""): ((d, n), "inner_size x state_size"),
                  (MT.SSM_D, ""): ((d,), "inner_size"),
                  (MT.SSM_OUT, "weight"): ((H, d), "embedding_length x inner_size")}
        if self.norm_weights:
            shapes |= {(MT.SSM_DT_NORM, "weight"): ((rank,), "time_step_rank"),
                       (MT.SSM_B_NORM, "weight"): ((n,), "state_size"), (MT.SSM_C_NORM, "weight"): ((n,), "state_size")}
        for spec in (s for s in self.specs if s.mixer == "mamba"):
            for (kind, suffix), (shape, why) in shapes.items():
                name = TENSOR_NAMES[kind].format(bid=spec.index) + (f".{suffix}" if suffix else "")
                expect(self, name, shape, why, required=True)

    def mixer(self, spec: LayerSpec, t: BlockTensors) -> nn.Module:
        return read_mamba(self, t, self.norm_weights) if spec.mixer == "mamba" else super().mixer(spec, t)

    def activation_bytes(self, batch: int, ctx: int, n_head: int, device: str = "cpu") -> int:
        d, n = int(self.key(Keys.SSM.INNER_SIZE)), int(self.key(Keys.SSM.STATE_SIZE))
        return super().activation_bytes(batch, ctx, n_head, device) + selective_scan_bytes(batch, d, n)


class Mamba(MambaLayers, DecoderArch):
    honours = frozenset({Keys.SSM.DT_B_C_RMS})

    def layer_spec(self, i: int) -> LayerSpec:
        return LayerSpec(i, "mamba", "")

    def layer(self, spec: LayerSpec, t: BlockTensors) -> OneBlockLayer:
        return OneBlockLayer(spec, self.hp.eps, attn_norm=t(MT.ATTN_NORM), op=self.mixer(spec, t))
