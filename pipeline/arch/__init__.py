"""Architecture registry keyed by `general.architecture`."""
from ..errors import UserError
from ..gguf_file import GGUFIndex
from .base import DecoderArch
from .gemma3 import Gemma3
from .llama import Llama
from .qwen2 import Qwen2

ARCHITECTURES: dict[str, type[DecoderArch]] = {"llama": Llama, "qwen2": Qwen2, "gemma3": Gemma3}


def load_architecture(gguf: GGUFIndex) -> DecoderArch:
    cls = ARCHITECTURES.get(gguf.architecture)
    if cls is None:
        raise UserError(f"{gguf.path}: architecture {gguf.architecture!r} is not supported "
                        f"(supported: {', '.join(sorted(ARCHITECTURES))})")
    return cls(gguf)
