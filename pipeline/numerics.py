"""The version of the numbers layercycle computes. Every output's identity carries it, so a
change of the code that moves a number gives new output folders: a resumed pass never mixes
windows computed by two versions, and an old run root is never read as the new code's result.

Raise VERSION for a change of shared code that moves any number (dequantizers, norms,
attention, the MoE block, recurrent kernels, scoring, tokenizers); raise a family's own
`numerics` (model/arch) for a change of that family's math alone, and SCORING for a change that
moves the Score task's figures alone (the LM head, log-softmax, KL statistics): its outputs are
renamed, the trunk's boundaries kept. Code that moves no number
(refactors, messages, speed at equal bits) raises nothing, and old run roots stay usable.
"""
VERSION = 3  # 2: the llama-cpp method reads a corpus without its last newline; 3: a text read with its CRs,
#   multiple choice right wherever an answer is labelled 1
SCORING = 2  # 2: a 16-bit head multiplies the normed state rounded to its dtype


def numerics_identity(family_version: int | None = None) -> dict:
    """The identity entry of an output: the package's version, and the family's for outputs
    its layers compute."""
    return {"numerics": VERSION if family_version is None else f"{VERSION}.{family_version}"}
