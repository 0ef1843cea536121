"""Where the repository keeps its configuration and caches."""
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS = REPO_ROOT / "configs"
TASKS = REPO_ROOT / "tasks"
DATA = REPO_ROOT / "data"
MODELS_CACHE = DATA / "models"
RUNS = DATA / "runs"
