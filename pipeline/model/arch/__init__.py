"""Architecture registry keyed by `general.architecture`."""
from ...errors import UserError
from ...gguf_io.reader import GGUFIndex
from .base import DecoderArch
from .gemma3 import Gemma3
from .llama import Llama
from .nemotron_h import NemotronH
from .qwen2 import Qwen2
from .qwen3next import Qwen3Next, Qwen35

ARCHITECTURES: dict[str, type[DecoderArch]] = {
    "llama": Llama, "qwen2": Qwen2, "gemma3": Gemma3, "qwen3": Qwen2, "qwen3moe": Qwen2,
    "qwen3next": Qwen3Next, "qwen35": Qwen35, "qwen35moe": Qwen35,
    "nemotron_h": NemotronH, "nemotron_h_moe": NemotronH,
}


def load_architecture(gguf: GGUFIndex) -> DecoderArch:
    cls = ARCHITECTURES.get(gguf.architecture)
    if cls is None:
        raise UserError(f"{gguf.path}: architecture {gguf.architecture!r} is not supported "
                        f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(gguf)
