"""What llama-perplexity computes for each member of the conformance matrix with its weights in
8 bits, the reference of `--numerics llama-cpp`'s cell (tests/test_conformance.py).

Each member is converted by llama.cpp's converter with `--outtype q8_0` (a synthetic member is
written with Q4_0 matrices instead), and llama-perplexity (llama-cpp-python 0.3.36) runs its
default command over the first CHUNKS chunks of head40k:
`llama-perplexity -m MEMBER -f wikitext-2-test.head40k.txt -c CTX -b CTX --chunks 32 -t 2
--kl-divergence-base FILE`. From its base file are kept the chunks' tokens (as tokenized, before
a BOS is put in) and the NLL of each scored token (its target's log-probability, to the file's
16 bits of a row's range).

`python -m tests.numerics_reference [NAME ...]` writes the named members' entries (all members
by default) into tests/data/llama-cpp-numerics.npz; a member llama.cpp cannot load is reported
and left out.
"""
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pipeline.run.logits_file import chunk_rows, read_header, read_tokens
from pipeline.tools.llamacpp import llama_perplexity

from .helpers import HEAD40K, REFERENCE

STORED = REFERENCE / "llama-cpp-numerics.npz"
CHUNKS = 32
LLAMA_CPP_PYTHON = "0.3.36"


def read() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{member: (tokens [CHUNKS, ctx] int32, NLL [CHUNKS, scored] float32)} of the stored file."""
    with np.load(STORED) as f:
        return {key[:-len(".tokens")]: (f[key], f[key[:-len(".tokens")] + ".nll"]) for key in f.files
                if key.endswith(".tokens")}


def target_nll(base: Path) -> tuple[np.ndarray, np.ndarray]:
    """(tokens [n_chunk, n_ctx], the NLL of each chunk's scored targets [n_chunk, rows]) of a base file."""
    h = read_header(str(base))
    tokens = read_tokens(str(base)).reshape(h.n_chunk, h.n_ctx)
    nll = []
    for c in range(h.n_chunk):
        rows = np.asarray(chunk_rows(str(base), c))
        scale, low = rows[:, :4].copy().view(np.float32).T                       # [rows] each
        targets = tokens[c, h.n_ctx - h.rows_per_chunk:]
        codes = rows[np.arange(h.rows_per_chunk), 4 + targets].astype(np.float32)
        nll.append(-(scale * codes + low))
    return tokens.astype(np.int32), np.stack(nll).astype(np.float32)


def measured(path: Path, ctx: int) -> tuple[np.ndarray, np.ndarray]:
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.kld"
        cmd = [str(llama_perplexity(LLAMA_CPP_PYTHON)), "-m", str(path), "-f", str(HEAD40K), "-c", str(ctx),
               "-b", str(ctx), "--chunks", str(CHUNKS), "-t", "2", "--kl-divergence-base", str(base)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode or not base.is_file():
            raise RuntimeError(f"llama-perplexity failed on {path}: {done.stderr[-500:]}")
        return target_nll(base)


def main(names: list[str]) -> None:
    from pipeline.tools.architectures import MATRIX

    from .hf_models import member_in_8_bits

    stored = read() if STORED.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in [m for m in MATRIX if not names or m.name in names]:
            try:
                stored[m.name] = measured(member_in_8_bits(m, Path(tmp)), m.ctx)
                print(m.name, "measured")
            except RuntimeError as e:
                print(m.name, "left out:", str(e).splitlines()[0])
    np.savez_compressed(STORED, **{f"{name}.{part}": a for name, pair in sorted(stored.items())
                                   for part, a in zip(("tokens", "nll"), pair)})


if __name__ == "__main__":
    main(sys.argv[1:])
