"""The resumable chunk writer on its own (no model, no Luigi): every chunk computed once, a
rerun after a kill computes only what is missing, a damaged chunk is recomputed, the next
chunk is read while the current one computes."""
import threading

import numpy as np
import pytest

from pipeline.store.chunk_writer import fill, resumable_array

SHAPE, PER = (7, 3, 4), 2   # 7 sequences in chunks of 2: four chunks, the last one short
ATTRS = {"identity": {"layers": (0, 4)}, "output": "abc"}


class Killed(Exception):
    """Stands for the process being killed at that point."""


def source(i: int) -> np.ndarray:
    """What chunk i reads: [sequences in chunk, 3, 4]."""
    n = min(PER, SHAPE[0] - i * PER)
    return np.full((n, *SHAPE[1:]), float(i), dtype=np.float32)


def expected() -> np.ndarray:
    return np.concatenate([2 * source(i) + 1 for i in range(4)])


def compute_counting(calls: list, kill_at: int | None = None):
    def load():
        def compute(i, x):
            if i == kill_at:
                raise Killed
            calls.append(i)
            return 2 * x + 1
        return compute
    return load


def array(tmp_path):
    return resumable_array(tmp_path / "out.zarr", SHAPE, PER, "float32", ATTRS)


def test_every_chunk_is_computed_once_and_stored(tmp_path):
    calls = []
    stats = fill(array(tmp_path), source, compute_counting(calls), "test")
    assert calls == [0, 1, 2, 3]
    assert stats["chunks"] == 4 and stats["chunks_computed"] == 4 and stats["chunks_found"] == 0
    out = array(tmp_path)
    np.testing.assert_array_equal(np.concatenate([out.read_chunk(i) for i in range(4)]), expected())
    assert (tmp_path / "journal.log").read_text().splitlines()[-1] == "wrote 3"


def test_a_rerun_after_a_kill_computes_only_the_missing_chunks(tmp_path):
    with pytest.raises(Killed):
        fill(array(tmp_path), source, compute_counting([], kill_at=2), "test")
    half_written = array(tmp_path).chunk_file(2).with_name("0.abc.partial")   # what Zarr leaves when killed
    half_written.parent.mkdir(parents=True, exist_ok=True)
    half_written.write_bytes(b"\0" * 10)
    calls = []
    stats = fill(array(tmp_path), source, compute_counting(calls), "test")
    assert calls == [2, 3] and stats["chunks_found"] == 2 and stats["chunks_corrupted"] == 0
    assert not half_written.exists()
    out = array(tmp_path)
    np.testing.assert_array_equal(np.concatenate([out.read_chunk(i) for i in range(4)]), expected())


def test_a_damaged_chunk_is_recomputed(tmp_path):
    fill(array(tmp_path), source, compute_counting([]), "test")
    chunk = array(tmp_path).chunk_file(1)
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    calls = []
    stats = fill(array(tmp_path), source, compute_counting(calls), "test")
    assert calls == [1] and stats["chunks_corrupted"] == 1
    np.testing.assert_array_equal(array(tmp_path).read_chunk(1), expected()[2:4])


def test_nothing_is_loaded_when_every_chunk_is_there(tmp_path):
    fill(array(tmp_path), source, compute_counting([]), "test")

    def load():
        raise AssertionError("the weights were loaded with nothing to compute")
    assert fill(array(tmp_path), source, load, "test")["chunks_found"] == 4


def test_an_array_of_another_task_is_not_resumed(tmp_path):
    with pytest.raises(Killed):
        fill(array(tmp_path), source, compute_counting([], kill_at=2), "test")
    other = resumable_array(tmp_path / "out.zarr", SHAPE, PER, "float32", {**ATTRS, "output": "xyz"})
    calls = []
    fill(other, source, compute_counting(calls), "test")
    assert calls == [0, 1, 2, 3]


def test_the_next_chunk_is_read_while_one_computes(tmp_path):
    read_started = [threading.Event() for _ in range(4)]

    def read(i):
        read_started[i].set()
        return source(i)

    def load():
        assert read_started[0].wait(5), "chunk 0 was not read while the weights loaded"

        def compute(i, x):
            if i + 1 < 4:
                assert read_started[i + 1].wait(5), f"chunk {i + 1} was not read while chunk {i} computed"
            return 2 * x + 1
        return compute
    fill(array(tmp_path), read, load, "test")


def blocking_writes(out, started: dict, finished: dict, overlap: set = frozenset(), die: set = frozenset()):
    """Make `out`'s chunk writes record when they start and end; a write of a chunk in
    `overlap` or `die` waits until the next chunk's compute has begun (which a write on the
    compute thread never sees), and one in `die` then dies unwritten (the process killed mid-write)."""
    write = out.write_chunk

    def slow_write(i, data):
        started[i].set()
        if i in overlap | die:
            assert computing[i + 1].wait(5), f"chunk {i + 1} did not compute while chunk {i} was written"
        if i in die:
            raise Killed
        write(i, data)
        finished[i].set()
    computing = {i: threading.Event() for i in range(5)}
    out.write_chunk = slow_write
    return computing


def test_write_behind_overlaps_compute_with_one_write_in_flight(tmp_path):
    started, finished = ({i: threading.Event() for i in range(4)} for _ in range(2))
    out = array(tmp_path)
    computing = blocking_writes(out, started, finished, overlap={0, 1, 2})

    def load():
        def compute(i, x):
            computing[i].set()
            if i >= 2:   # chunk i - 2 is stored before chunk i computes: one write in flight at most
                assert finished[i - 2].is_set(), f"chunk {i} computed while chunk {i - 2} was still unwritten"
            return 2 * x + 1
        return compute
    fill(out, source, load, "test", write_behind=True)
    out = array(tmp_path)
    np.testing.assert_array_equal(np.concatenate([out.read_chunk(i) for i in range(4)]), expected())
    assert (tmp_path / "journal.log").read_text().splitlines()[-1] == "wrote 3"


@pytest.mark.parametrize("write_behind, redone", [(False, [2, 3]), (True, [1, 2, 3])])
def test_a_kill_loses_one_chunk_or_with_write_behind_two(tmp_path, write_behind, redone):
    """Killed while computing chunk 2: without write-behind chunk 1 is stored already; with it,
    chunk 1's write may be in flight and is lost too (NUMERICS.md's bound)."""
    started, finished = ({i: threading.Event() for i in range(4)} for _ in range(2))
    out = array(tmp_path)
    computing = blocking_writes(out, started, finished, die={1} if write_behind else set())

    def load():
        def compute(i, x):
            computing[i].set()
            if i == 2:
                if write_behind:
                    assert started[1].wait(5) and not finished[1].is_set()   # chunk 1 still being written
                raise Killed
            return 2 * x + 1
        return compute
    with pytest.raises(Killed):
        fill(out, source, load, "test", write_behind=write_behind)
    calls = []
    fill(array(tmp_path), source, compute_counting(calls), "test", write_behind=write_behind)
    assert calls == redone
    out = array(tmp_path)
    np.testing.assert_array_equal(np.concatenate([out.read_chunk(i) for i in range(4)]), expected())
