"""Architecture registry keyed by `general.architecture`."""
import functools

from ...errors import UserError
from ...gguf_io.reader import GGUFIndex
from .afmoe import Afmoe
from .apertus import Apertus
from .bailingmoe2 import BailingMoe2
from .bailingmoe3 import BailingMoe3
from .cohere import Cohere2, Cohere2Moe, CommandR
from .deci import Deci
from .deepseek2 import Deepseek2
from .deepseek4 import Deepseek4
from .deepseek32 import Deepseek32
from .dots1 import Dots1
from .dots3note import Dots3Note
from .ernie4_5_moe import Ernie45Moe
from .exaone4 import Exaone4
from .exaone_moe import ExaoneMoe
from .falcon_h1 import FalconH1
from .family import DecoderArch
from .gemma2 import Gemma2
from .gemma3 import Gemma3
from .gemma4 import Gemma4
from .glm4 import Glm4
from .glm4moe import Glm4Moe
from .glm5next import Glm5Next
from .glm_dsa import GlmDsa
from .gpt_oss import GptOss
from .granite import Granite, GraniteHybrid
from .grok import Grok
from .hunyuan_moe import HunyuanMoe
from .hy_v3 import HyV3
from .hy_v4 import HyV4
from .jamba import Jamba
from .kimi_k3 import KimiK3
from .kimi_linear import KimiLinear
from .laguna import Laguna
from .lfm2 import Lfm2
from .llama import Llama
from .llama4 import Llama4
from .mamba import Mamba
from .mimo2 import Mimo2
from .minimax01 import Minimax01
from .minimax_m2 import MinimaxM2
from .minimax_m3 import MinimaxM3
from .mistral3 import Mistral3
from .muse_glimmer import MuseGlimmer
from .nemotron_h import NemotronH
from .olmo2 import Olmo2
from .olmoe import Olmoe
from .phi3 import Phi3
from .qwen2 import Qwen2, Qwen2Moe, Qwen2VL, Qwen3VL
from .qwen3next import Qwen3Next, Qwen35
from .qwen4exp import Qwen4Exp
from .seed_oss import SeedOss
from .smollm3 import SmolLM3
from .step35 import Step35

ARCHITECTURES: dict[str, type[DecoderArch]] = {
    "llama": Llama, "qwen2": Qwen2, "gemma3": Gemma3, "gemma4": Gemma4, "qwen3": Qwen2, "qwen3moe": Qwen2,
    "qwen3next": Qwen3Next, "qwen35": Qwen35, "qwen35moe": Qwen35, "qwen4exp": Qwen4Exp,
    "nemotron_h": NemotronH, "nemotron_h_moe": NemotronH, "deepseek2": Deepseek2, "deepseek32": Deepseek32,
    "deepseek4": Deepseek4,
    "glm-dsa": GlmDsa,
    "glm4moe": Glm4Moe, "mistral3": Mistral3, "mistral4": Deepseek2,   # Mistral 4: llama.cpp's deepseek2 graph
    "qwen3vl": Qwen3VL, "qwen3vlmoe": Qwen3VL, "gpt-oss": GptOss,
    "minimax-m2": MinimaxM2, "llama4": Llama4, "ernie4_5-moe": Ernie45Moe,
    "qwen2moe": Qwen2Moe, "glm4": Glm4, "exaone4": Exaone4, "smollm3": SmolLM3, "olmo2": Olmo2, "olmoe": Olmoe,
    "seed_oss": SeedOss, "gemma2": Gemma2, "granite": Granite, "granitemoe": Granite, "granitehybrid": GraniteHybrid,
    "phi3": Phi3, "command-r": CommandR, "cohere2": Cohere2, "cohere2moe": Cohere2Moe,
    "lfm2": Lfm2, "lfm2moe": Lfm2, "falcon-h1": FalconH1, "afmoe": Afmoe, "mimo2": Mimo2,
    "kimi-linear": KimiLinear, "step35": Step35, "minimax-m3": MinimaxM3, "bailingmoe2": BailingMoe2,
    "bailingmoe3": BailingMoe3, "kimi-k3": KimiK3, "glm5-next": Glm5Next,
    "dots1": Dots1, "dots3note": Dots3Note,
    "hunyuan-moe": HunyuanMoe, "hy_v3": HyV3, "hy_v4": HyV4, "deci": Deci,
    "qwen2vl": Qwen2VL, "apertus": Apertus, "laguna": Laguna, "grok": Grok, "mamba": Mamba, "jamba": Jamba,
    "minimax-01": Minimax01, "exaone-moe": ExaoneMoe, "muse-glimmer": MuseGlimmer,
}


@functools.lru_cache(maxsize=8)
def load_architecture(gguf: GGUFIndex) -> DecoderArch:
    """The family of `gguf`, its metadata read and checked once per opened file."""
    cls = ARCHITECTURES.get(gguf.architecture)
    if cls is None:
        raise UserError(f"{gguf.path}: architecture {gguf.architecture!r} is not supported "
                        f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(gguf)
