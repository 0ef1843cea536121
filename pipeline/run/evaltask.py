"""Evaluation tasks (tasks/NAME.toml): where the corpus comes from and the default method."""
import hashlib
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..paths import REPO_ROOT, TASKS


@dataclass(frozen=True)
class EvalTask:
    name: str
    description: str
    source: str          # "pydoc-topics", "file" or "dataset"
    path: str            # source "file": the corpus shipped in the repository (relative to its root);
                         # "dataset": the dataset's name in run/eval_data.py
    method: dict         # defaults: name, ctx, chunks, ...


def load_eval_task(name: str) -> EvalTask:
    path = TASKS / f"{name}.toml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in TASKS.glob("*.toml")))
        raise UserError(f"unknown evaluation task {name!r} (known: {known})")
    with open(path, "rb") as f:
        spec = tomllib.load(f)
    corpus = spec["corpus"]
    return EvalTask(name, spec.get("description", ""), corpus["source"], corpus.get("path", corpus.get("dataset", "")),
                    spec.get("method", {}))


def pydoc_topics_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def corpus_source(task: EvalTask, corpus: str) -> tuple[Path | None, str]:
    """(file, label) of the corpus: --corpus PATH wins over the task's own source; no file for
    Python's pydoc topics. The label of a shipped corpus is its path inside the repository, the
    same in every checkout."""
    if corpus:
        return Path(corpus).expanduser(), str(Path(corpus).expanduser().resolve())
    if task.source == "pydoc-topics":
        return None, "pydoc_data.topics"
    if task.source == "dataset":
        from .eval_data import PACKAGE, dataset_file

        return dataset_file(task.path), f"{task.path} ({PACKAGE})"
    if task.path:
        return REPO_ROOT / task.path, task.path
    raise UserError(f"evaluation task {task.name!r} needs the corpus file: pass --corpus PATH")


def corpus_text(task: EvalTask, corpus: str) -> tuple[str, str]:
    """(text, label) of the corpus."""
    path, label = corpus_source(task, corpus)
    return (pydoc_topics_text() if path is None else read_text_file(path)), label


def corpus_bytes(task: EvalTask, corpus: str) -> tuple[bytes, str]:
    """(bytes, label) of a binary task file."""
    path, label = corpus_source(task, corpus)
    if path is None or not path.is_file():
        raise UserError(f"task file {path} does not exist")
    return path.read_bytes(), label


def read_text_file(path: Path) -> str:
    """The file's bytes as UTF-8 text, line ends as they are (CR kept, as a C++ program reads them)."""
    if not path.is_file():
        raise UserError(f"corpus file {path} does not exist")
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"corpus file {path} is not UTF-8 text ({e})") from None


# common's string_process_escapes: a backslash and one of these is that one character; \xHH one
# byte where strtol reads both characters as hex (an optional space or sign, then digits)
ESCAPES = {ord("n"): b"\n", ord("r"): b"\r", ord("t"): b"\t", ord("'"): b"'", ord('"'): b'"', ord("\\"): b"\\"}
ESCAPE = re.compile(rb"\\(x(?:[ \t\n\v\f\r+-][0-9a-fA-F]|[0-9a-fA-F]{2})|.)", re.DOTALL)


def process_escapes(data: bytes) -> bytes:
    """llama.cpp's string_process_escapes (`-e`/`--escape`); any other backslash stays with the
    character after it."""
    def one(m: re.Match) -> bytes:
        code = m.group(1)
        if len(code) == 3:
            return bytes([int(code[1:], 16) & 0xFF])
        return ESCAPES.get(code[0], m.group(0))

    return ESCAPE.sub(one, data)


def llama_prompt(text: str, escape: bool = False) -> str:
    """The text llama-perplexity reads from `-f FILE` (common's -f handler): the file's bytes
    without one final newline (a CR before it stays), escape sequences processed only where
    `-e`/`--escape` is given (llama-perplexity turns them off by default)."""
    text = text.removesuffix("\n")
    if not escape:
        return text
    try:
        return process_escapes(text.encode("utf-8")).decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"the corpus's escape sequences make bytes that are not UTF-8 text ({e}), which are not "
                        f"computed here; leave --escape out to read them as they are") from None


def text_sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
