"""Several worker processes on one luigid (loopback): every task runs once, and the sweep's
numbers equal a local-scheduler run's."""
import csv
import os
import socket
import subprocess
import sys
import time

import luigi
import pytest

from pipeline import Sweep
from pipeline.paths import CONFIGS, REPO_ROOT

from .helpers import free_port

SWEEP = """
models = ["smollm2-135m"]
ctx = 64
window_layers = [10, 0]
chunks = 2
out = "{out}"
"""



@pytest.fixture
def luigid(tmp_path):
    port = free_port()
    (tmp_path / "luigid").mkdir()
    proc = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "luigid"), "--port", str(port),
                             "--address", "127.0.0.1", "--logdir", str(tmp_path / "luigid"),
                             "--state-path", str(tmp_path / "luigid" / "state.pickle")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    yield port
    proc.terminate()
    proc.wait(10)


def sweep_file(tmp_path, name):
    path = tmp_path / f"{name}.toml"
    path.write_text(SWEEP.format(out=tmp_path / name))
    return path


def ppl_column(folder):
    return [(r["ctx"], r["placement"], r["ppl"]) for r in csv.DictReader(open(folder / "sweep.csv"))]


def test_two_workers_share_one_scheduler(luigid, tmp_path):
    shared = sweep_file(tmp_path, "shared")
    env = {**os.environ, "LUIGI_CONFIG_PATH": str(CONFIGS / "luigid.cfg")}
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "Sweep", "--config", str(shared),
           "--run-root", str(tmp_path / "runs"), "--scheduler-port", str(luigid)]
    workers = [subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True) for _ in range(2)]
    logs = [w.communicate(timeout=900)[0] for w in workers]
    failures = "\n".join(f"{w.returncode}: {log[-3000:]}" for w, log in zip(workers, logs))
    assert all(w.returncode == 0 for w in workers), failures
    assert sum("2 runs:" in log for log in logs) >= 1
    journals = list((tmp_path / "runs").glob("*/*/journal.log"))
    assert journals
    for journal in journals:   # no chunk computed twice, by one worker or by both
        computed = [line for line in journal.read_text().splitlines() if line.startswith("computing")]
        assert len(computed) == len(set(computed)), journal

    local = sweep_file(tmp_path, "local")
    assert luigi.build([Sweep(config=str(local), run_root=str(tmp_path / "local-runs"))], local_scheduler=True,
                       log_level="WARNING")
    assert ppl_column(tmp_path / "shared") == ppl_column(tmp_path / "local")


def test_tasks_placed_on_cuda_hold_a_gpu_resource():
    from pipeline import Embed, LayerWindow, Score

    placement = "cuda:0:4,cpu:4:30"
    assert LayerWindow(placement=placement, first=0, last=4).resources == {"gpu": 1}
    assert LayerWindow(placement=placement, first=4, last=30).resources == {}
    assert Score(placement="cpu:0:26,cuda:26:30").resources == {"gpu": 1}
    assert Embed(placement=placement).resources == {}


def test_more_shards_than_chunks_is_refused_before_any_work(tmp_path):
    """A shard takes whole Zarr chunks of sequences: two sequences in one chunk make one shard."""
    from pipeline import PerplexityRun
    from pipeline.errors import UserError

    from .helpers import HEAD40K

    run = PerplexityRun(device="cpu", task="wikitext-2", corpus=str(HEAD40K), ctx=64, chunks=2, shards=3,
                        run_root=str(tmp_path))
    with pytest.raises(UserError, match=r"--shards 3: the corpus gives 2 sequences, 1 Zarr chunk of "
                                        r"--sequences-per-chunk 4, .* give at most --shards 1"):
        run.score_tasks(check_memory=False)
    assert not list(tmp_path.iterdir())
