"""Architecture registry keyed by `general.architecture`."""
from ...errors import UserError
from ...gguf_io.reader import GGUFIndex
from .base import DecoderArch
from .deepseek2 import Deepseek2
from .ernie4_5_moe import Ernie45Moe
from .gemma3 import Gemma3
from .glm4moe import Glm4Moe
from .gpt_oss import GptOss
from .llama import Llama
from .llama4 import Llama4
from .minimax_m2 import MinimaxM2
from .mistral3 import Mistral3
from .nemotron_h import NemotronH
from .qwen2 import Qwen2, Qwen3VL
from .qwen3next import Qwen3Next, Qwen35

ARCHITECTURES: dict[str, type[DecoderArch]] = {
    "llama": Llama, "qwen2": Qwen2, "gemma3": Gemma3, "qwen3": Qwen2, "qwen3moe": Qwen2,
    "qwen3next": Qwen3Next, "qwen35": Qwen35, "qwen35moe": Qwen35,
    "nemotron_h": NemotronH, "nemotron_h_moe": NemotronH, "deepseek2": Deepseek2,
    "glm4moe": Glm4Moe, "mistral3": Mistral3, "mistral4": Deepseek2,   # Mistral 4: llama.cpp's deepseek2 graph
    "qwen3vl": Qwen3VL, "qwen3vlmoe": Qwen3VL, "gpt-oss": GptOss,
    "minimax-m2": MinimaxM2, "llama4": Llama4, "ernie4_5-moe": Ernie45Moe,
}


def load_architecture(gguf: GGUFIndex) -> DecoderArch:
    cls = ARCHITECTURES.get(gguf.architecture)
    if cls is None:
        raise UserError(f"{gguf.path}: architecture {gguf.architecture!r} is not supported "
                        f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(gguf)
