"""Where the repository keeps its configuration and caches, and where a run's outputs go."""
import contextlib
import fcntl
import os
from pathlib import Path

from upath import UPath

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
TASKS = REPO_ROOT / "tasks"
DATA = REPO_ROOT / "data"
CORPORA = DATA / "corpora"   # shipped corpora (tracked), with their source notes
MODELS_CACHE = DATA / "models"
EVAL_CACHE = DATA / "eval"      # evaluation data fetched on first use (run/eval_data.py)
TOKENIZERS_CACHE = DATA / "tokenizers"   # SentencePiece tokenizers, built (gguf_io/tokenizer_cache.py)
RUNS = DATA / "runs"


def location(url: str) -> UPath:
    """A run root given as a local path or any fsspec URL (`s3://bucket/prefix`, ...). A local
    one (`file://` included) is a `pathlib.Path`; anything else is an object store's path."""
    path = UPath(url)
    if path.protocol in ("", "file", "local"):
        return UPath(path.path)
    # no cached listings: other processes' outputs, locks and reader markers must be seen at once
    return UPath(url, use_listings_cache=False)


def is_local(path) -> bool:
    return isinstance(path, Path)


@contextlib.contextmanager
def filling(entry: Path):
    """One process at a time fills the cache entry `entry` (a model fetched, llama.cpp's sources
    unpacked or one of its tools built): another one waits for it, then finds the entry there."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.with_name(f".{entry.name}.lock"), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)   # released with the handle, or by the system if the process dies
        yield


def keep_in_cache(entry: Path, text: str) -> None:
    """Write a cache entry whole (through a temporary file renamed over it, so a reader finds it
    whole or absent, whichever process writes it); where the cache cannot be written, nothing:
    a missing entry only costs the work again next time."""
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        tmp = entry.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(entry)
    except OSError:
        pass
