"""llama-perplexity, built once from the llama.cpp sources vendored in llama-cpp-python's sdist
and cached outside the repository (~/.cache/layercycle, or $LAYERCYCLE_CACHE)."""
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from .errors import UserError

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def cache_dir() -> Path:
    return Path(os.environ.get("LAYERCYCLE_CACHE", Path.home() / ".cache" / "layercycle"))


def llama_perplexity(version: str) -> Path:
    root = cache_dir() / f"llama-cpp-python-{version}"
    binary = root / "build" / "bin" / "llama-perplexity"
    if binary.is_file():
        return binary
    sdist_dir = cache_dir() / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        _check([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                "-d", str(sdist_dir), f"llama-cpp-python=={version}"], "download llama-cpp-python's sdist")
    source = root / "src"
    if not source.is_dir():
        with tarfile.open(sdist) as tar:
            tar.extractall(source, filter="data")
    llama = next(source.glob("*/vendor/llama.cpp"))
    build = root / "build"
    _check(["cmake", "-S", str(llama), "-B", str(build), "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
            "-DCMAKE_BUILD_TYPE=Release"], "configure llama.cpp")
    _check(["cmake", "--build", str(build), "--target", "llama-perplexity", "-j", str(os.cpu_count() or 2)],
           "build llama-perplexity")
    return binary


def _check(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"could not {what}: {tail[0]}")


def parse_final_estimate(output: str) -> tuple[float, float]:
    match = FINAL.search(output)
    if not match:
        raise UserError("llama-perplexity printed no final estimate")
    return float(match.group(1)), float(match.group(2))
