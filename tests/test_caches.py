"""The caches beside the runs (registered models, evaluation data, llama.cpp's sources and tools)
are filled by one process at a time: two runs, or two test workers, started on a fresh machine
wait for one fetch instead of unpacking into each other's files."""
import subprocess
import sys

HOLD = """
import sys, time
from pathlib import Path
from pipeline.paths import filling
with filling(Path(sys.argv[1])):
    began = time.time()
    time.sleep(0.5)
    print(began, time.time())
"""


def test_two_processes_fill_one_cache_entry_one_after_the_other(tmp_path):
    entry = tmp_path / "cache" / "model.gguf"
    both = [subprocess.Popen([sys.executable, "-c", HOLD, str(entry)], stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    (a_began, a_ended), (b_began, b_ended) = sorted(tuple(map(float, p.communicate()[0].split())) for p in both)
    assert all(p.returncode == 0 for p in both)
    assert a_ended <= b_began
