"""A run root on an S3-compatible object store (moto's server on loopback): a pass killed
mid-way resumes there and gives the result of a run on local disk; locks and reader markers
work without rename or flock."""
import json
import os
import socket
import subprocess
import sys
import time

import pytest

from pipeline.errors import UserError
from pipeline.paths import location
from pipeline.store import outputs
from pipeline.tools.stress import kill_and_resume, load_settings, result_numbers, run_pass

from .helpers import assert_one_line_error, free_port, luigi_cli

BUCKET = "layercycle-runs"



@pytest.fixture(scope="module")
def s3():
    """The URL of an empty bucket on a moto server; the AWS variables point every process at it."""
    import fsspec

    port = free_port()
    server = subprocess.Popen([os.path.join(os.path.dirname(sys.executable), "moto_server"),
                               "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    with pytest.MonkeyPatch.context() as env:
        for key, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "testing",
                           "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
            env.setenv(key, value)
        fsspec.filesystem("s3").clear_instance_cache()
        fsspec.filesystem("s3").mkdir(BUCKET)
        yield f"s3://{BUCKET}"
        fsspec.filesystem("s3").clear_instance_cache()
    server.terminate()
    server.wait(10)


def test_a_pass_killed_on_s3_resumes_to_the_local_result(s3, tmp_path):
    settings = load_settings()
    code, err = run_pass(tmp_path, settings)
    assert code == 0, "".join(err[-20:])
    local = result_numbers(tmp_path)

    root = location(f"{s3}/killed")
    outcome = kill_and_resume(root, settings, local, fault="chunk-written@LayerWindow [10..20)#2")
    assert outcome.killed            # the killed writer's lock object is taken over on this host
    assert outcome.identical         # bit-identical to the pass on local disk
    assert outcome.recomputed == 0   # the two chunks written before the kill are reused
    manifests = [json.loads(m.read_text()) for m in root.glob("*/*/manifest.json")]
    assert {m["task"] for m in manifests} == {"Tokenize", "Embed", "LayerWindow", "Score"}
    assert sum(m.get("boundary_removed", False) for m in manifests) == 4  # consumed boundaries freed
    assert not list(root.glob(".locks/*.lock"))  # no lock left behind


def test_a_second_writer_is_refused_while_the_lock_is_held(s3):
    out = location(f"{s3}/locks/Embed/0123")
    with outputs.locked(out, "Embed"):
        with pytest.raises(UserError, match="already running"):
            with outputs.locked(out, "Embed"):
                pass
    with outputs.locked(out, "Embed"):  # released when the first writer ended
        pass


def test_a_lock_of_a_dead_process_on_this_host_is_taken_over(s3):
    out = location(f"{s3}/stale/Embed/0123")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = out.parent.parent / ".locks" / "Embed.0123.lock"
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": dead.pid, "since": 0}))
    with outputs.locked(out, "Embed"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
    lock.write_text(json.dumps({"host": "another-host", "pid": dead.pid, "since": 0}))
    with pytest.raises(UserError, match="already running"):  # elsewhere: nothing tells it is gone
        with outputs.locked(out, "Embed"):
            pass


def test_a_lock_is_a_lease_renewed_while_held_and_taken_over_once_it_ends(s3, monkeypatch):
    """A host that died leaves its lock: once its lease has ended the next writer takes it over,
    naming the old holder in one line; a live holder renews its lease, so it is never taken."""
    import threading

    monkeypatch.setattr(outputs, "LEASE_S", 0.6)
    out = location(f"{s3}/leases/Embed/0123")
    lock = out.parent.parent / ".locks" / "Embed.0123.lock"
    lock.write_text(json.dumps({"host": "gone-host", "pid": 1, "since": 0, "expires": time.time() + 1.5}))
    with pytest.raises(UserError, match="already running"):          # its lease still runs
        with outputs.locked(out, "Embed"):
            pass
    said = []
    monkeypatch.setattr(outputs.log, "warning", said.append)
    started = time.monotonic()
    with outputs.locked(out, "Embed", wait=True):                    # waits for the lease to end
        assert 1.0 < time.monotonic() - started < 1.5 + 2 * outputs.POLL_S + 1
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        taken = [line for line in said if "taking its task over" in line]
        assert len(taken) == 1 and "the lease of gone-host pid 1 ended" in taken[0]
        refused = []

        def another_writer():
            for _ in range(6):                                       # 1.8 s: three leases' length
                try:
                    with outputs.locked(out, "Embed"):
                        refused.append(False)
                except UserError:
                    refused.append(True)
                time.sleep(0.3)
        other = threading.Thread(target=another_writer)
        other.start()
        other.join()
        assert refused == [True] * 6                                 # renewed, never taken
    assert not lock.exists()
    with pytest.raises(UserError, match="another worker took its task over"):   # a lease lost: no manifest
        outputs.commit(out, {"task": "Embed"}, held=lambda: False)
    assert not outputs.is_complete(out)


def test_data_being_read_is_not_removed(s3):
    out = location(f"{s3}/readers/LayerWindow/abcd")
    (out / "boundary.zarr").mkdir(parents=True, exist_ok=True)
    (out / "boundary.zarr" / "zarr.json").write_text("{}")
    outputs.write_json(out / outputs.MANIFEST, {"task": "LayerWindow"})
    with outputs.reading(out, reader="consumer"):
        assert not outputs.remove_data(out, "boundary.zarr", "boundary_removed")
        assert outputs.read_manifest(out) == {"task": "LayerWindow"}
    assert outputs.remove_data(out, "boundary.zarr", "boundary_removed")
    assert outputs.read_manifest(out) == {"task": "LayerWindow", "boundary_removed": True}
    assert not (out / "boundary.zarr" / "zarr.json").exists()


def test_a_missing_bucket_is_one_line(s3):
    done = luigi_cli("--chunks", "1", "--ctx", "64", run_root="s3://no-such-bucket/runs")
    assert_one_line_error(done, "cannot write under s3://no-such-bucket/runs: The specified bucket does not exist")
