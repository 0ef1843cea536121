"""The resumable chunk writer: fill a chunked array chunk by chunk, so that a process killed at
any moment loses at most the chunk it was computing.

A rerun reopens the array (dropping half-written chunk files), keeps every chunk whose checksum
holds and computes the others. Knows no Luigi and no model: what a chunk holds comes from the
caller's `read` and `compute`.
"""
import json
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from .arrays import ChunkedArray
from .faults import failpoint, reached
from .outputs import append_line
from .timing import Stopwatch, folder_bytes

log = logging.getLogger("layercycle")


def resumable_array(path: Path, shape: tuple[int, ...], per_chunk: int, dtype: str, attrs: dict) -> ChunkedArray:
    """The array at `path`, reopened with the chunks it already holds where an interrupted
    writer left it with the same attributes and shape; else a new, empty one."""
    attrs = json.loads(json.dumps({**attrs, "dtype": dtype}))  # as it reads back (tuples become lists)
    if (path / "zarr.json").is_file():
        existing = ChunkedArray.open_for_update(path)
        if existing.attrs == attrs and existing.array.shape == shape:
            return existing
    return ChunkedArray.create(path, shape, per_chunk, dtype, attrs)


def fill(out: ChunkedArray, read, load, label: str, clock: Stopwatch | None = None, progress=None,
         check=None, write_behind: bool = False) -> dict:
    """Write every chunk of `out` that is missing or damaged: chunk i is `compute(i, read(i))`,
    with `compute = load()` called once, and only if a chunk is to be computed. A background
    thread reads one chunk ahead (the first while `load` runs). `check(i, data)` sees each
    chunk before it is written and raises to stop the task without writing it. Each chunk
    computed is journalled beside the array (`journal.log`); `progress(done, total, computed,
    tokens, started, load_s)` is called after each: `started` is when the first chunk began
    computing, after the `load_s` seconds that `load` took, so that the pace of the chunks
    counts no load. With `write_behind` a chunk is compressed and
    written by another thread while the next one computes, one write in flight at most (a kill
    loses at most two chunks: the one computing and the one being written; else one). Returns
    the counts for the task's manifest."""
    clock = clock or Stopwatch()
    journal = out.path.parent / "journal.log"
    todo = [i for i in range(out.n_chunks) if not out.verified(i)]
    corrupted = [i for i in todo if out.chunk_file(i).is_file()]
    for i in corrupted:
        log.warning(f"{label}: chunk {i} failed its checksum; recomputing it")
    started, load_s, done_tokens = time.time(), 0.0, 0

    def store(k: int, i: int, data) -> None:
        nonlocal done_tokens
        failpoint("mid-chunk-write", label,
                  partial_file=out.chunk_file(i).with_name(out.chunk_file(i).name + ".0badc0de.partial"))
        with clock("write"):
            out.write_chunk(i, data)
        append_line(journal, f"wrote {i}")
        failpoint("chunk-written", label)
        done_tokens += data.shape[0] * out.array.shape[1]
        if progress is not None:
            progress(out.n_chunks - len(todo) + k, out.n_chunks, k, done_tokens, started, load_s)

    with (ThreadPoolExecutor(max_workers=1, thread_name_prefix="read-ahead") as reader,
          ThreadPoolExecutor(max_workers=1, thread_name_prefix="write-behind") as writer):
        ahead, writing = [reader.submit(read, i) for i in todo[:1]], None
        if todo:
            with clock("load"):
                compute = load()
            load_s, started = time.time() - started, time.time()
        for k, i in enumerate(todo, 1):
            append_line(journal, f"computing {i}")
            with clock("read"):  # what the read-ahead did not hide
                source = ahead.pop().result()
            ahead += [reader.submit(read, j) for j in todo[k:k + 1]]
            with clock("compute"):
                data = compute(i, source)
            if reached("non-finite", label):
                data = np.full_like(data, np.nan)
            if check is not None:
                with clock("check"):
                    check(i, data)
            failpoint("chunk-computed", label)
            if writing is not None:
                with clock("write-wait"):  # what the write-behind did not hide
                    writing.result()
            if write_behind:
                writing = writer.submit(store, k, i, data)
            else:
                store(k, i, data)
        if writing is not None:
            writing.result()
    return {"chunks": out.n_chunks, "chunks_found": out.n_chunks - len(todo), "chunks_computed": len(todo),
            "chunks_corrupted": len(corrupted), "bytes_written": folder_bytes(out.path)}
