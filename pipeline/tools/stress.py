"""Crash test: kill a real pass with SIGKILL at chosen points or random moments, rerun the same
command, and check the result is bit-identical and at most one chunk per task was redone.

    python -m pipeline.stress [--kills 50] [--seed 0] [--config configs/stress.toml]

Prints the tally: kills, identical results, chunks recomputed, corrupted chunks detected.
The same functions drive the fixed crash tests in tests/test_crash.py.

    python -m pipeline.stress --headers 20000 [--seed 0]

fuzzes the config's model's header instead (pipeline/tools/fuzz_headers.py): prints how many
variants were accepted, refused in one line or failed, and each failure.
"""
import argparse
import contextlib
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..paths import CONFIGS, REPO_ROOT

NUMBERS = ("ppl", "ppl_stderr", "mean_nll", "tokens_scored", "chunks", "per_window")


def load_settings(path: Path = CONFIGS / "stress.toml") -> dict:
    with open(path, "rb") as f:
        settings = tomllib.load(f)
    settings["corpus"] = str((REPO_ROOT / settings["corpus"]).resolve())
    return settings


def pass_args(settings: dict) -> list[str]:
    keys = ("model", "task", "corpus", "ctx", "chunks", "sequences_per_chunk", "window_layers", "device")
    optional = ("compute_dtype", "device_memory")
    return [arg for k in keys + tuple(k for k in optional if k in settings)
            for arg in (f"--{k.replace('_', '-')}", str(settings[k]))]


def run_pass(run_root: Path, settings: dict, fault: str = "", kill_at: tuple[int, float] | None = None,
             stamps: list[float] | None = None):
    """One `luigi --module pipeline PerplexityRun` process; returns (exit code, stderr lines).
    `kill_at=(n, delay)` sends SIGKILL `delay` seconds after its n-th line of progress; `stamps`
    (a list) receives the seconds from the start to each line."""
    cmd = [sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun", *pass_args(settings),
           "--run-root", str(run_root), "--result-json", str(run_root / "result.json")]
    env = {k: v for k, v in os.environ.items() if k != "LAYERCYCLE_FAULT"}
    if fault:
        env["LAYERCYCLE_FAULT"] = fault
    proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    lines, started = [], time.time()
    n, delay = kill_at if kill_at is not None else (math.inf, 0.0)
    while len(lines) < n and (line := proc.stderr.readline()):
        lines.append(line)
        if stamps is not None:
            stamps.append(time.time() - started)
    if kill_at is not None:
        time.sleep(delay)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        lines += proc.stderr.readlines()
    proc.wait()
    return proc.returncode, lines


def result_numbers(run_root: Path) -> dict:
    result = json.loads((run_root / "result.json").read_text())
    return {k: result[k] for k in NUMBERS}


def recomputed_chunks(run_root: Path) -> dict[str, int]:
    """Per task folder: chunks its journal shows computed more than once."""
    out = {}
    for journal in run_root.glob("*/*/journal.log"):
        computing = [line.split()[1] for line in journal.read_text().splitlines() if line.startswith("computing")]
        out[f"{journal.parent.parent.name}/{journal.parent.name}"] = len(computing) - len(set(computing))
    return out


def corrupted_detected(run_root: Path) -> int:
    return sum(json.loads(m.read_text()).get("chunks_corrupted", 0) for m in run_root.glob("*/*/manifest.json"))


@dataclass
class Outcome:
    killed: bool
    identical: bool
    recomputed: int      # chunks redone over all tasks
    worst_task: int      # most chunks redone by one task
    corrupted: int


def kill_and_resume(run_root: Path, settings: dict, reference: dict, fault: str = "",
                    kill_at: tuple[int, float] | None = None) -> Outcome:
    code, _ = run_pass(run_root, settings, fault, kill_at)
    killed = code == -signal.SIGKILL
    code, err = run_pass(run_root, settings)
    if code != 0:
        raise RuntimeError(f"the rerun failed ({code}):\n{''.join(err[-20:])}")
    redone = recomputed_chunks(run_root)
    return Outcome(killed, result_numbers(run_root) == reference, sum(redone.values()),
                   max(redone.values(), default=0), corrupted_detected(run_root))


def fuzz_headers(model: str, variants: int, seed: int) -> int:
    from ..gguf_io.registry import resolve_model
    from .fuzz_headers import fuzz

    with tempfile.TemporaryDirectory(prefix="layercycle-fuzz-") as tmp:
        outcome = fuzz(resolve_model(model), variants, seed, Path(tmp))
    for k, change, what in outcome["failures"]:
        print(f"variant {k} ({change}):\n{what}")
    for key, value in outcome["tally"].items():
        print(f"{key:<24}{value}")
    return 1 if outcome["failures"] else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline.stress", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=CONFIGS / "stress.toml")
    parser.add_argument("--kills", type=int, default=None, help="random kills (default: the config's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--headers", type=int, default=0, help="fuzz this many variants of the model's header")
    args = parser.parse_args(argv)
    settings = load_settings(args.config)
    if args.headers:
        return fuzz_headers(settings["model"], args.headers, args.seed)
    kills = args.kills or settings["kills"]
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="layercycle-stress-") as tmp:
        tmp = Path(tmp)
        stamps = []
        code, lines = run_pass(tmp / "reference", settings, stamps=stamps)
        if code != 0:
            print("".join(lines), file=sys.stderr)
            return 1
        # kill moments spread over the whole pass: after a random line of its progress, a random
        # part of the time the reference pass took to its next line (so the kill falls before
        # the pass ends, on a machine as fast as it was)
        gaps = [b - a for a, b in zip(stamps, stamps[1:])]
        reference = result_numbers(tmp / "reference")
        tally = {"kills": 0, "identical results": 0, "chunks recomputed": 0,
                 "most chunks recomputed by one task": 0, "corrupted chunks detected": 0}
        k = 0
        while tally["kills"] < kills and k < 3 * kills:  # a pass that finished first is no kill
            n = rng.randrange(1, len(lines))
            kill_at = (n, rng.uniform(0, 1) * gaps[n - 1])
            o = kill_and_resume(tmp / f"kill-{k}", settings, reference, kill_at=kill_at)
            k += 1
            tally["kills"] += o.killed
            tally["identical results"] += o.identical
            tally["chunks recomputed"] += o.recomputed
            tally["most chunks recomputed by one task"] = max(tally["most chunks recomputed by one task"], o.worst_task)
            tally["corrupted chunks detected"] += o.corrupted
            print(f"run {k}: kill {kill_at[1]:.1f}s after progress line {kill_at[0]}, killed={o.killed}, "
                  f"identical={o.identical}, recomputed={o.recomputed}", flush=True)
    tally["runs"] = k
    print()
    for key, value in tally.items():
        print(f"{key:<36}{value}")
    ok = tally["identical results"] == k and tally["most chunks recomputed by one task"] <= 1
    return 0 if ok else 1


