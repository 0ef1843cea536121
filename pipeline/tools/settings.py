"""The tools' settings files: TOML, named from the repository root."""
import tomllib
from pathlib import Path

from ..errors import UserError
from ..paths import REPO_ROOT


def read_settings(path: Path) -> dict:
    """A settings file's tables, or a UserError naming the file and why it cannot be read."""
    try:
        with open(REPO_ROOT / path, "rb") as f:
            return tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
