"""llama.cpp's KL-divergence base file, as `llama-perplexity --kl-divergence-base` writes it and
`--kl-divergence` reads it: the magic `_logits_`, n_ctx, n_vocab and n_chunk (int32 each), the
n_chunk x n_ctx token ids (int32) the base was computed over, then for each chunk the rows of its
scored positions (the last n_ctx - 1 - n_ctx/2 of them): a float32 scale and a float32 minimum
log-probability, then n_vocab uint16 codes (padded to an even count), log p = scale * code + min.
Knows no model: the codes are made and compared in model/kld.py."""
import os
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

    def chunk_offset(self, chunk: int) -> int:
        """Where chunk `chunk`'s rows begin."""
        return self.rows_offset + 2 * self.row_width * self.rows_per_chunk * chunk

    def size(self) -> int:
        return self.chunk_offset(self.n_chunk)


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
    return np.memmap(path, dtype="<u2", mode="r", offset=h.chunk_offset(chunk), shape=(h.rows_per_chunk, h.row_width))


def start_file(path: Path, header: LogitsHeader, tokens: np.ndarray) -> None:
    """The file laid out whole at `path`, its header and tokens written, its rows' place sparse
    (taking no disk until written); rows an interrupted writer left are kept."""
    with open(path, "r+b" if path.is_file() else "wb") as f:
        f.truncate(header.size())
        f.write(HEADER.pack(MAGIC, header.n_ctx, header.n_vocab, header.n_chunk))
        f.write(np.ascontiguousarray(tokens, dtype="<i4").tobytes())


def write_rows(path: Path, header: LogitsHeader, chunk: int, rows: np.ndarray) -> None:
    """rows [rows_per_chunk, row_width] uint16 of chunk `chunk` into their place in the file."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, np.ascontiguousarray(rows, dtype="<u2").tobytes(), header.chunk_offset(chunk))
    finally:
        os.close(fd)


def publish(path: Path, header: LogitsHeader, sources: list[tuple[Path, range]]) -> bool:
    """The file at `path` from files laid out by start_file, each holding the rows of the chunks
    its range names. One file holding every chunk becomes `path` by a hard link where both are on
    one file system (no second copy on disk; True); otherwise the chunks are copied aside and
    renamed: whole or absent (a disk that fills removes what was written)."""
    (first, _), *_ = sources
    if path.is_file() and path.samefile(first):
        return True
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    if len(sources) == 1:
        try:
            os.link(first, partial)
            partial.replace(path)
            return True
        except OSError:      # another file system, or one without hard links: copied
            partial.unlink(missing_ok=True)
    try:
        with open(partial, "wb") as out:
            with open(first, "rb") as src:
                out.write(src.read(header.rows_offset))
            for source, chunks in sources:
                with open(source, "rb") as src:
                    src.seek(header.chunk_offset(chunks.start))
                    left = header.chunk_offset(chunks.stop) - header.chunk_offset(chunks.start)
                    while left and (block := src.read(min(left, 1 << 24))):
                        out.write(block)
                        left -= len(block)
    except OSError as e:
        partial.unlink(missing_ok=True)
        raise UserError(f"cannot write {path}: {e.strerror}; the run's outputs are kept, and a rerun with "
                        f"more room writes it") from None
    if (written := partial.stat().st_size) != header.size():
        partial.unlink()
        raise UserError(f"{path}: {written:,} bytes written, {header.size():,} expected")
    partial.replace(path)
    return False
