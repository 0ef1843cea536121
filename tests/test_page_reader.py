"""The page reader asks the kernel for the byte ranges it is given in file order, a read-ahead
window at a time, and for no more than the bytes allowed; a window's read-ahead asks it for
exactly the bytes of its tensors."""
import time
from pathlib import Path

from pipeline.gguf_io import page_reader
from pipeline.gguf_io.page_reader import PageReader, merged
from pipeline.gguf_io.reader import GGUFIndex


def test_touching_and_overlapping_ranges_are_joined_in_file_order():
    assert merged([(50, 60), (0, 10), (10, 20), (15, 18), (30, 40)]) == [(0, 20), (30, 40), (50, 60)]


def test_the_reader_asks_for_the_ranges_piece_by_piece_up_to_the_limit(tmp_path, monkeypatch):
    path = tmp_path / "model.bin"
    path.write_bytes(bytes(100_000))
    monkeypatch.setattr(page_reader, "piece_bytes", lambda path: 4096)
    asked = []

    class Recording(PageReader):
        def advise(self, fd, offset, length):
            asked.append((offset, length))

    queued = Recording().read(path, [(60_000, 70_000), (0, 10_000), (10_000, 12_000)], limit=20_000)
    deadline = time.monotonic() + 10
    while sum(n for _, n in asked) < queued and time.monotonic() < deadline:
        time.sleep(0.01)
    assert queued == 20_000                       # [0, 12000) whole, then 8000 bytes of [60000, 70000)
    assert asked == [(0, 4096), (4096, 4096), (8192, 3808), (60_000, 4096), (64_096, 3904)]


def test_a_hint_reads_at_most_the_devices_read_ahead_window(tmp_path):
    assert page_reader.piece_bytes(Path("/proc/self/status")) == page_reader.DEFAULT_PIECE  # no block device
    assert page_reader.piece_bytes(tmp_path) % 4096 == 0 < page_reader.piece_bytes(tmp_path)


def test_a_window_reads_ahead_the_bytes_of_its_tensors(model_path, monkeypatch):
    gguf = GGUFIndex(model_path("smollm2-135m"))
    asked = []
    monkeypatch.setattr(page_reader.PAGE_READER, "read",
                        lambda path, ranges, limit: asked.append((path, sorted(ranges), limit)) or 1000)
    names = [t.name for i in (3, 4) for t in gguf.layer_tensors(i)]
    gguf.read_ahead(names, limit=1 << 30)
    expected = sorted((gguf.tensors[n].offset, gguf.tensors[n].offset + gguf.tensors[n].n_bytes) for n in names)
    assert asked == [(gguf.path, expected, 1 << 30)]
