"""The choice tasks beside llama-perplexity (`kind = "choice-tasks"` of `python -m pipeline.bench`):
each model on each task file, llama-perplexity's command and layercycle's, one after the other,
wall time of the whole process (model load and tokenization included on both sides), the ratio
(llama-perplexity's time over layercycle's: above 1, layercycle is faster), each side's
accuracy and the positions layercycle computed beside llama-perplexity's count."""
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..paths import REPO_ROOT
from ..run.eval_data import dataset_file
from .bench import _env, drop_page_cache, model_path, run_sampled
from .llamacpp import llama_perplexity

# task -> (the dataset, llama-perplexity's and layercycle's option of the file, of the task count)
TASKS = {"hellaswag": ("hellaswag", "--hellaswag", "--hellaswag-tasks"),
         "winogrande": ("winogrande", "--winogrande", "--winogrande-tasks"),
         "arc-challenge": ("arc-challenge", "--multiple-choice", "--multiple-choice-tasks"),
         "arc-easy": ("arc-easy", "--multiple-choice", "--multiple-choice-tasks"),
         "mmlu": ("mmlu", "--multiple-choice", "--multiple-choice-tasks")}
# llama-perplexity refuses a multiple-choice task with more answers than its parallel sequences (-np)
LLAMA_PARALLEL = {"--multiple-choice": 8}
# llama-perplexity's last accuracy line of each kind of task
ACCURACY = {"--hellaswag": re.compile(r"^\d+\t([0-9.]+)%\t\[", re.M),
            "--winogrande": re.compile(r"Final Winogrande score\(\d+ tasks\): ([0-9.]+)"),
            "--multiple-choice": re.compile(r"Final result: ([0-9.]+)")}


@dataclass
class Side:
    wall_s: float
    accuracy: float
    positions: dict | None = None    # layercycle's: computed, llama_perplexity


def llama_side(binary: Path, model: Path, file: Path, task: str, n_tasks: int, cfg: dict) -> Side:
    _, option, count = TASKS[task]
    parallel = ["-np", str(LLAMA_PARALLEL[option])] if option in LLAMA_PARALLEL else []
    done, wall, _ = run_sampled([str(binary), "-m", str(model), "-f", str(file), option, count, str(n_tasks),
                                 "-c", str(cfg["llama_ctx"]), "-t", str(cfg["threads"]), *parallel],
                                env=_env(cfg["threads"]))
    found = ACCURACY[option].findall(done.stdout + done.stderr)
    if done.returncode or not found:
        raise UserError(f"llama-perplexity {option} failed on {model}: {done.stderr.strip().splitlines()[-1:]}")
    return Side(wall, float(found[-1]))


def layercycle_side(model: Path, file: Path, task: str, n_tasks: int, cfg: dict) -> Side:
    _, option, count = TASKS[task]
    with tempfile.TemporaryDirectory(prefix="layercycle-bench-") as tmp:
        root = Path(tmp)
        done, wall, _ = run_sampled([sys.executable, "-m", "luigi", "--module", "pipeline", "PerplexityRun",
                                     "--model", str(model), option, str(file), count, str(n_tasks),
                                     "--compute-dtype", cfg["compute_dtype"], "--run-root", str(root),
                                     "--result-json", str(root / "result.json")], cwd=REPO_ROOT,
                                    env=_env(cfg["threads"]))
        if done.returncode:
            raise UserError(f"layercycle {option} failed on {model}: {done.stderr.strip().splitlines()[-1:]}")
        result = json.loads((root / "result.json").read_text())
    key = next(k for k in ("hellaswag", "winogrande", "multiple-choice") if k in result)
    return Side(wall, result[key]["accuracy"], result["positions"])


def bench_choice_tasks(cfg: dict) -> None:
    binary = llama_perplexity(cfg["llama_cpp_python"])
    print("| model | task | tasks | llama-perplexity s | layercycle s | ratio | accuracy llama-perplexity "
          "| accuracy layercycle | positions computed | llama-perplexity's |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for alias in cfg["models"]:
        model = model_path(alias, cfg)
        for task, n_tasks in cfg["tasks"].items():
            file = dataset_file(TASKS[task][0])
            sides = {"llama": [], "layercycle": []}
            for _ in range(cfg["repetitions"]):       # in turn, so a slow spell falls on both alike
                for name, run in (("llama", lambda: llama_side(binary, model, file, task, n_tasks, cfg)),
                                  ("layercycle", lambda: layercycle_side(model, file, task, n_tasks, cfg))):
                    if cfg.get("drop_page_cache"):
                        drop_page_cache()
                    sides[name].append(run())
            # each side's run of median wall time
            llama, ours = (sorted(s, key=lambda side: side.wall_s)[len(s) // 2] for s in sides.values())
            print(f"| {alias} | {task} | {n_tasks or 'all'} | {llama.wall_s:.1f} | {ours.wall_s:.1f} "
                  f"| {llama.wall_s / ours.wall_s:.2f} | {llama.accuracy:.4f} | {ours.accuracy:.4f} "
                  f"| {ours.positions['computed']:,} | {ours.positions['llama_perplexity']:,} |", flush=True)
