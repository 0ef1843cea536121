"""The version of the numbers layercycle computes. Every output's identity carries it, so a
change of the code that moves a number gives new output folders: a resumed pass never mixes
windows computed by two versions, and an old run root is never read as the new code's result.

Raise VERSION for a change of shared code that moves any number (dequantizers, norms,
attention, the MoE block, recurrent kernels, scoring, tokenizers); raise a family's own
`numerics` (model/arch) for a change of that family's math alone, SCORING for a change that
moves the Score task's figures alone (the LM head, log-softmax, KL statistics): its outputs are
renamed, the trunk's boundaries kept; and EMULATION for a change that moves the llama-cpp mode's
numbers alone. Code that moves no number (refactors, messages, speed at equal bits) raises
nothing, and old run roots stay usable.

The mode (`--numerics exact|llama-cpp`) is set for the process by each task that computes
(`set_numerics`) before it reads layers; model/llama_cpp_numerics.py computes what the second
mode changes.
"""
from .errors import UserError

VERSION = 3  # 2: the llama-cpp method reads a corpus without its last newline; 3: a text read with its CRs,
#   multiple choice right wherever an answer is labelled 1
SCORING = 2  # 2: a 16-bit head multiplies the normed state rounded to its dtype
EMULATION = 2  # the llama-cpp mode's own: 2: RMSNorm sums its squares in float64, as ggml-cpu does


def numerics_identity(family_version: int | None = None) -> dict:
    """The identity entry of an output: the package's version, and the family's for outputs
    its layers compute."""
    return {"numerics": VERSION if family_version is None else f"{VERSION}.{family_version}"}


def mode_identity(mode: str) -> dict:
    """The identity entry of an output the layers or the head compute in `mode`: exact adds nothing,
    so the outputs made before the modes existed keep their names; the other mode its version."""
    return {} if mode == "exact" else {"numerics_mode": mode, "emulation": EMULATION}


MODES = ("exact", "llama-cpp")
# the architectures not checked against llama-perplexity's default command (every other one is, in
# the conformance matrix), and why
UNLOADED = "the llama.cpp it is checked against (llama-cpp-python 0.3.36) cannot load its test model"
NOT_EMULATED = {"qwen35": UNLOADED, "qwen35moe": UNLOADED, "nemotron_h": UNLOADED, "ernie4_5-moe": UNLOADED,
                "deepseek4": "its compressed attention's cache and grouped output products are not emulated"}

_mode = "exact"


def set_numerics(mode: str, architecture: str) -> None:
    """Compute in `mode` from now on in this process; a family not emulated in it refused in one line."""
    global _mode
    check_emulated(mode, architecture)
    _mode = mode


def check_emulated(mode: str, architecture: str) -> None:
    if mode == "llama-cpp" and architecture in NOT_EMULATED:
        raise UserError(f"--numerics llama-cpp is not emulated for the {architecture} architecture "
                        f"({NOT_EMULATED[architecture]}); use --numerics exact")


def emulating() -> bool:
    return _mode == "llama-cpp"
