"""Evaluation tasks (tasks/NAME.toml): where the corpus comes from and the default method."""
import hashlib
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import UserError
from .paths import TASKS


@dataclass(frozen=True)
class EvalTask:
    name: str
    description: str
    source: str          # "pydoc-topics" or "file"
    method: dict         # defaults: name, ctx, chunks, ...


def load_eval_task(name: str) -> EvalTask:
    path = TASKS / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TASKS.glob("*.toml")))
        raise UserError(f"unknown evaluation task {name!r} (known: {known})")
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    return EvalTask(name, spec.get("description", ""), spec["corpus"]["source"], spec.get("method", {}))


def pydoc_topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def corpus_text(task: EvalTask, corpus: str) -> tuple[str, str]:
    """(text, label) of the corpus: --corpus PATH wins over the task's own source."""
    if corpus:
        path = Path(corpus).expanduser()
        if not path.is_file():
            raise UserError(f"corpus file {corpus} does not exist")
        try:
            return path.read_text(encoding="utf-8"), str(path.resolve())
        except UnicodeDecodeError as e:
            raise UserError(f"corpus file {corpus} is not UTF-8 text ({e})") from None
    if task.source == "pydoc-topics":
        return pydoc_topics_text(), "pydoc_data.topics"
    raise UserError(f"evaluation task {task.name!r} needs the corpus file: pass --corpus PATH")


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
