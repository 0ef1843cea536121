"""llama.cpp's sources as vendored in llama-cpp-python's sdist (for llama-perplexity and
convert_hf_to_gguf.py), fetched once and cached outside the repository (~/.cache/layercycle,
or $LAYERCYCLE_CACHE)."""
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from ..errors import UserError
from ..paths import filling

FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")


def cache_dir() -> Path:
    return Path(os.environ.get("LAYERCYCLE_CACHE", Path.home() / ".cache" / "layercycle"))


def llama_cpp_source(version: str) -> Path:
    """The vendored llama.cpp tree of llama-cpp-python `version`, downloaded and unpacked once."""
    source = cache_dir() / f"llama-cpp-python-{version}" / "src"
    with filling(source):
        return _unpacked(version, source)


def _unpacked(version: str, source: Path) -> Path:
    if found := list(source.glob("*/vendor/llama.cpp")):
        return found[0]
    sdist_dir = cache_dir() / "sdist"
    sdist = sdist_dir / f"llama_cpp_python-{version}.tar.gz"
    if not sdist.is_file():
        run_checked([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "-q",
                "-d", str(sdist_dir), f"llama-cpp-python=={version}"], "download llama-cpp-python's sdist")
    partial = source.with_name("src.partial")  # unpacked aside, renamed when whole
    shutil.rmtree(partial, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(partial, filter="data")
    partial.rename(source)
    return next(source.glob("*/vendor/llama.cpp"))


def llama_tool(version: str, name: str) -> Path:
    """llama.cpp's program `name` (llama-perplexity, llama-quantize), built once from the sources
    of llama-cpp-python `version`."""
    return _built(version, name, name)


def ggml_cpu_library(version: str) -> Path:
    """ggml's CPU backend (libggml-cpu.so) of llama-cpp-python `version`, built once: its quantizers
    and dot products, called through ctypes, are the reference for llama.cpp's numerics."""
    return _built(version, "ggml-cpu", "libggml-cpu.so")


def llama_library(version: str) -> Path:
    """llama.cpp's library (libllama.so) of llama-cpp-python `version`, built once: what its Python
    bindings (the sdist's llama_cpp package) load."""
    return _built(version, "llama", "libllama.so")


def _built(version: str, target: str, file: str) -> Path:
    # Built for this CPU without AMX: the AMX kernels of this llama.cpp stop with an illegal
    # instruction on Xeons that have it (the AVX-512 VNNI kernels are used instead).
    root = cache_dir() / f"llama-cpp-python-{version}"
    build = root / "build-native-noamx"
    binary = build / "bin" / file
    if binary.is_file():
        return binary
    llama = llama_cpp_source(version)
    with filling(build):                   # one build at a time in the build tree
        if not binary.is_file():           # or built by another process meanwhile
            _build(llama, build, target)
    return binary


def _build(llama: Path, build: Path, name: str) -> None:
    no_amx = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
    if not (build / "CMakeCache.txt").is_file():
        run_checked(["cmake", "-S", str(llama), "-B", str(build), "-DGGML_NATIVE=ON", "-DLLAMA_CURL=OFF",
                "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_C_FLAGS={no_amx}", f"-DCMAKE_CXX_FLAGS={no_amx}"],
               "configure llama.cpp")
    run_checked(["cmake", "--build", str(build), "--target", name, "-j", str(os.cpu_count() or 2)], f"build {name}")


def llama_perplexity(version: str) -> Path:
    return llama_tool(version, "llama-perplexity")


def run_checked(cmd: list[str], what: str) -> None:
    """Run `cmd`; where it fails, one line: what could not be done and its last line of output."""
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise UserError(f"could not {what}: {tail[0]}")


def parse_final_estimate(output: str) -> tuple[float, float]:
    match = FINAL.search(output)
    if not match:
        raise UserError("llama-perplexity printed no final estimate")
    return float(match.group(1)), float(match.group(2))
