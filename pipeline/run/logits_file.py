"""llama.cpp's KL-divergence base file, as `llama-perplexity --kl-divergence-base` writes it and
`--kl-divergence` reads it: the magic `_logits_`, n_ctx, n_vocab and n_chunk (int32 each), the
n_chunk x n_ctx token ids (int32) the base was computed over, then for each chunk the rows of its
scored positions (the last n_ctx - 1 - n_ctx/2 of them): a float32 scale and a float32 minimum
log-probability, then n_vocab uint16 codes (padded to an even count), log p = scale * code + min.
Knows no model: the codes are made and compared in model/kld.py."""
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import UserError

MAGIC = b"_logits_"
HEADER = struct.Struct("<8siii")


@dataclass(frozen=True)
class LogitsHeader:
    n_ctx: int
    n_vocab: int
    n_chunk: int

    @property
    def rows_per_chunk(self) -> int:
        """Scored positions of a chunk: its targets after the first n_ctx/2."""
        return self.n_ctx - 1 - self.n_ctx // 2

    @property
    def row_width(self) -> int:
        """uint16 values per row: scale and minimum (two float32), the codes, padding to even."""
        return 2 * ((self.n_vocab + 1) // 2) + 4

    @property
    def tokens_offset(self) -> int:
        return HEADER.size

    @property
    def rows_offset(self) -> int:
        return HEADER.size + 4 * self.n_ctx * self.n_chunk

    def size(self) -> int:
        return self.rows_offset + 2 * self.row_width * self.rows_per_chunk * self.n_chunk


def is_logits_file(path: str) -> bool:
    p = Path(path)
    if not p.is_file():
        return False
    with open(p, "rb") as f:
        return f.read(len(MAGIC)) == MAGIC


def read_header(path: str) -> LogitsHeader:
    with open(path, "rb") as f:
        raw = f.read(HEADER.size)
    if len(raw) < HEADER.size or raw[:8] != MAGIC:
        raise UserError(f"{path} is not a llama.cpp KL-divergence base file (no `_logits_` header)")
    header = LogitsHeader(*HEADER.unpack(raw)[1:])
    if min(header.n_ctx, header.n_vocab, header.n_chunk) < 1 or header.n_ctx < 4:
        raise UserError(f"{path}: a header of n_ctx {header.n_ctx}, n_vocab {header.n_vocab}, "
                        f"n_chunk {header.n_chunk} describes no base")
    actual = Path(path).stat().st_size
    if actual != header.size():
        raise UserError(f"{path} holds {actual:,} bytes; its header (n_ctx {header.n_ctx}, n_vocab "
                        f"{header.n_vocab}, {header.n_chunk} chunks) needs {header.size():,}: the file is "
                        f"truncated or not llama-perplexity's")
    return header


def read_tokens(path: str) -> np.ndarray:
    """The base's token ids, n_chunk x n_ctx of them, as the corpus was tokenized (no BOS put in)."""
    h = read_header(path)
    return np.fromfile(path, dtype="<i4", count=h.n_ctx * h.n_chunk, offset=h.tokens_offset)


def chunk_rows(path: str, chunk: int) -> np.ndarray:
    """[rows_per_chunk, row_width] uint16 of one chunk, mapped, not read."""
    h = read_header(path)
    per_chunk = h.rows_per_chunk * h.row_width
    return np.memmap(path, dtype="<u2", mode="r", offset=h.rows_offset + 2 * per_chunk * chunk,
                     shape=(h.rows_per_chunk, h.row_width))


def write_file(path: Path, header: LogitsHeader, tokens: np.ndarray, chunk_parts: list[Path]) -> None:
    """The file from its header, tokens and each chunk's rows (one file per chunk, in order),
    written aside and renamed: whole or absent (a disk that fills removes what was written)."""
    partial = path.with_name(path.name + ".partial")
    try:
        with open(partial, "wb") as out:
            out.write(HEADER.pack(MAGIC, header.n_ctx, header.n_vocab, header.n_chunk))
            out.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())
            for part in chunk_parts:
                with open(part, "rb") as src:
                    while block := src.read(1 << 24):
                        out.write(block)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {e.strerror}; the run's outputs are kept, and a rerun with "
                        f"more room writes it") from None
    if partial.stat().st_size != header.size():
        raise UserError(f"{partial}: {partial.stat().st_size:,} bytes written, {header.size():,} expected")
    partial.replace(path)
