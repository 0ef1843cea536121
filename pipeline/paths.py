"""Where the repository keeps its configuration and caches, and where a run's outputs go."""
from pathlib import Path

from upath import UPath

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
TASKS = REPO_ROOT / "tasks"
DATA = REPO_ROOT / "data"
CORPORA = DATA / "corpora"   # shipped corpora (tracked), with their source notes
MODELS_CACHE = DATA / "models"
EVAL_CACHE = DATA / "eval"      # evaluation data fetched on first use (run/eval_data.py)
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
