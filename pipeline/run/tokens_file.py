"""Token ids given or dumped as files (--tokens-file, --dump-tokens): a .npy array, whitespace-separated
integers, or llama.cpp's KL-divergence base file (read only: the tokens it was computed over)."""
from pathlib import Path

import numpy as np

from ..errors import UserError


def read_tokens_file(path: str) -> np.ndarray:
    """Token ids of a .npy array, of whitespace-separated integers, or of llama.cpp's KL-divergence
    base file (the tokens it was computed over)."""
    from .logits_file import is_logits_file, read_tokens

    p = Path(path)
    if not p.is_file():
        raise UserError(f"tokens file {path} does not exist")
    if is_logits_file(path):
        return read_tokens(path).astype(np.int32)
    try:
        tokens = np.load(p) if p.suffix == ".npy" else np.array(p.read_text().split(), dtype=np.int64)
    except ValueError as e:
        raise UserError(f"tokens file {path} is not a .npy array or whitespace-separated ids ({e})") from None
    return tokens.astype(np.int32).ravel()


def write_tokens_file(path: str, tokens: np.ndarray) -> None:
    """Token ids as --tokens-file reads them: a .npy array, or otherwise one id per line;
    written aside and renamed, so the file is whole or absent."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    partial = p.with_name(p.name + ".partial")
    try:
        if p.suffix == ".npy":
            with open(partial, "wb") as f:
                np.save(f, np.asarray(tokens, dtype=np.int32))
        else:
            partial.write_text("".join(f"{t}\n" for t in np.asarray(tokens).tolist()))
        partial.replace(p)
    except OSError as e:
        raise UserError(f"cannot write --dump-tokens {path}: {e.strerror or e}") from None
