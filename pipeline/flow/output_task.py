"""The output protocol every task follows: an output folder named by a hash of what changes its
numbers and of its upstream outputs (so a changed option never reuses a stale result),
written under a lock, complete once its manifest is, filled chunk by chunk so an interrupted
task resumes; and the parameters every task of a run shares.
"""
import contextlib
import hashlib
import json
import logging
import time
from pathlib import Path

import luigi
import numpy as np

from ..errors import UserError
from ..paths import RUNS, location
from ..run.spec import resolve_run
from ..store import outputs
from ..store.faults import failpoint
from ..store.timing import Stopwatch, peak_rss_mb, reset_peak_rss
from . import console

log = logging.getLogger("layercycle")

# the parameters a run's spec is resolved from, in resolve_run's order
SPEC_PARAMS = ("model", "task", "corpus", "tokens_file", "method", "ctx", "stride", "unscored_prefix", "chunks", "bos",
               "hellaswag", "hellaswag_tasks", "winogrande", "winogrande_tasks", "multiple_choice",
               "multiple_choice_tasks", "escape")


class CompleteOutput(luigi.Target):
    """A task's output folder, which exists for Luigi once its manifest is written."""

    def __init__(self, path):
        self.path = path

    def exists(self) -> bool:
        return outputs.is_complete(self.path)


class RunTask(luigi.Task):
    """Parameters every task of a run shares: model, corpus and scoring method."""
    model = luigi.Parameter(default="smollm2-135m", description="alias from configs/models.toml or a GGUF path")
    task = luigi.Parameter(default="python-docs", description="evaluation task in tasks/")
    corpus = luigi.Parameter(default="", description="corpus text file (overrides the task's corpus)")
    tokens_file = luigi.Parameter(default="", description="pre-tokenized ids (.npy or whitespace-separated)")
    method = luigi.Parameter(default="", description="llama-cpp or stride (default: the task's)")
    ctx = luigi.IntParameter(default=0, description="tokens per sequence (default: the task's)")
    stride = luigi.IntParameter(default=0, description="stride method: tokens between sequence starts (default ctx/2)")
    unscored_prefix = luigi.IntParameter(default=-1, description="llama-cpp: unscored positions (default ctx/2)")
    chunks = luigi.IntParameter(default=-1, description="sequences to score, 0 = all (default: the task's)")
    bos = luigi.ChoiceParameter(choices=["auto", "yes", "no"], default="auto", description="BOS handling")
    hellaswag = luigi.Parameter(default="", description="HellaSwag: score this task file (llama.cpp's layout)")
    hellaswag_tasks = luigi.IntParameter(default=400, description="HellaSwag: tasks to score, in llama-perplexity's "
                                                                  "order (0: all)")
    winogrande = luigi.Parameter(default="", description="Winogrande: score this CSV (llama.cpp's layout)")
    winogrande_tasks = luigi.IntParameter(default=0, description="Winogrande: tasks to score, in llama-perplexity's "
                                                                 "order (0: all, in file order)")
    multiple_choice = luigi.Parameter(default="", description="multiple choice: score this binary task file "
                                                                "(llama.cpp's layout)")
    multiple_choice_tasks = luigi.IntParameter(default=0, description="multiple choice: tasks to score, in llama-"
                                                                      "perplexity's order (0: all, in file order)")
    escape = luigi.BoolParameter(default=False, description="process escape sequences (\\n, \\t, \\\\, \\xHH, ...) in "
                                 "the text, as llama-perplexity -e does (off there by default)")
    sequences_per_chunk = luigi.IntParameter(default=4, description="sequences per Zarr chunk and batch")
    windows_per_chunk = luigi.OptionalIntParameter(default=None, significant=False,
                                                   description="former name of --sequences-per-chunk")
    run_root = luigi.Parameter(default=str(RUNS), description="folder for all outputs")
    keep_boundaries = luigi.BoolParameter(default=False, significant=False,
                                          description="keep boundaries after their consumer completed")

    def __init__(self, *args, **kwargs):
        console.install()  # a process that makes tasks runs them: its console is set up once
        super().__init__(*args, **kwargs)

    @classmethod
    def get_param_values(cls, params, args, kwargs):
        """--windows-per-chunk, the former name, read as --sequences-per-chunk; where both are
        given with different values, the old one is kept for check_renamed to refuse."""
        values = dict(super().get_param_values(params, args, kwargs))
        old = values["windows_per_chunk"]
        if old is not None and ("sequences_per_chunk" not in kwargs or kwargs["sequences_per_chunk"] == old):
            values |= {"sequences_per_chunk": old, "windows_per_chunk": None}
        return [(name, values[name]) for name, _ in params]

    def check_renamed(self) -> None:
        if self.windows_per_chunk is not None:
            raise UserError(f"--windows-per-chunk {self.windows_per_chunk} and --sequences-per-chunk "
                            f"{self.sequences_per_chunk}: --windows-per-chunk is the former name of "
                            f"--sequences-per-chunk, give one")

    def spec(self):
        return resolve_run(*(getattr(self, p) for p in SPEC_PARAMS))


class OutputTask(RunTask):
    """A task that computes an output folder. Its Luigi task id is the folder's name, so the
    tasks of several runs that compute one output (the Embed of a cycled and of a whole-trunk
    run) are one task to the scheduler, run once by one worker."""
    reuses_weights = False  # takes over the weight block the last window left (weight_block.py)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        try:
            self.task_id = f"{self.task_family}_{self.out_dir().name}"
        except UserError:
            return  # an option that cannot be resolved is reported by run(), in one line
        self._Task__hash = hash(self.task_id)  # luigi.Task hashes its task id once, in __init__

    # -- identity and output ---------------------------------------------------------------
    def identity(self) -> dict:
        """What changes this task's numbers, besides its upstream outputs."""
        raise NotImplementedError

    def out_dir(self) -> Path:
        # named once per task object (Luigi keeps one per parameter set), so the chain of
        # windows above a task is hashed once, not again for every task below it
        if "_out_dir" not in self.__dict__:
            upstream = [t.out_dir().name for t in luigi.task.flatten(self.requires())]
            blob = json.dumps({"task": self.task_family, "identity": self.identity(), "upstream": upstream},
                              sort_keys=True)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
            self._out_dir = location(self.run_root) / self.task_family / digest
        return self._out_dir

    def output(self):
        return CompleteOutput(self.out_dir())

    def complete(self) -> bool:
        # an option that cannot be resolved is reported by run(), in one line, not here
        try:
            return super().complete()
        except UserError:
            return False

    def run(self):
        """This task's output, or, where computing it fails (a NaN, the device out of memory, a
        full disk, an input that failed), the failure recorded beside the output (`failure()`)
        and the task ended as Luigi's success: the tasks of other runs of a sweep go on, and the
        run's PerplexityRun or Sweep reports it in one line; a rerun tries it again."""
        upstream = chain_failure(t for t in luigi.task.flatten(self.requires()) if isinstance(t, OutputTask))
        failed = upstream and (upstream[1] if upstream[0].model == self.model
                               else f"its KL base {upstream[0].model}: {upstream[1]}")
        try:
            if failed:
                raise UserError(failed)
            yield from self.compute()
        except outputs.Busy:
            raise                    # another process computes this output: not this output's failure
        except UserError as e:
            with outputs.disk_errors(self.run_root):
                outputs.make_parent(self.failure_path())
                outputs.write_json(self.failure_path(), {"task": self.label(), "reason": str(e)})
            if not failed:
                log.warning(f"{self.label()} failed: {e}")

    def failure_path(self):
        return outputs.failure_record(self.out_dir())

    def failure(self) -> str | None:
        """Why the last attempt at this output failed, where it did and no attempt completed it
        since (a completed output's data may have been removed: then it is recomputed)."""
        try:
            if (self.out_dir() / outputs.MANIFEST).exists():
                return None
            return json.loads(self.failure_path().read_text())["reason"]
        except (OSError, ValueError, KeyError):
            return None

    def compute(self):
        # An input that another consumer removed after this task was scheduled is recomputed
        # first: Luigi runs what run() yields, then resumes it (luigi.cfg turns off Luigi's own
        # check, which would fail the task instead). Inputs are read under a shared lock, so
        # they are not removed while this task reads them.
        inputs = self.inputs_read()
        while True:
            missing = [t for t in inputs if not t.complete()]
            if missing:
                yield missing
            with contextlib.ExitStack() as reading:
                for t in inputs:
                    reading.enter_context(outputs.reading(t.out_dir(), reader=self.out_dir().name))
                if all(t.complete() for t in inputs):  # else removed between the check and the lock
                    self.execute_once()
                    break
        self.release_input()

    def execute_once(self) -> None:
        """execute() under this output's lock, unless another process finished it meanwhile."""
        shared = not luigi.interface.core().local_scheduler  # several workers, one luigid
        with (outputs.disk_errors(self.run_root),
              outputs.locked(self.out_dir(), self.task_family, wait=shared) as self.held):
            if not self.complete():
                self.started, self.clock = time.time(), Stopwatch()
                self.prepare()
                if not self.reuses_weights:
                    from ..model.weight_block import drop_kept

                    drop_kept()
                reset_peak_rss()
                self.execute()

    def inputs_read(self) -> list:
        """Upstream outputs whose data this task reads while it runs."""
        return []

    def prepare(self) -> None:
        """What the process needs before this task runs (PlacedTask: settings for compute)."""

    def release_input(self) -> None:
        """What a task does once its output is complete (PlacedTask: free the consumed boundary)."""

    def execute(self) -> None:
        raise NotImplementedError

    def begin(self) -> Path:
        if self.sequences_per_chunk < 1:
            raise UserError(f"--sequences-per-chunk must be >= 1, got {self.sequences_per_chunk}")
        work = outputs.begin(self.out_dir(), {"task": self.task_family, **self.to_str_params(),
                                              "identity": self.identity()})
        outputs.remove_file(self.failure_path())      # a new attempt: what the last one said is past
        self.earlier_s, self.earlier_attempts = outputs.earlier_attempts(work)
        return work

    def commit(self, **manifest) -> None:
        s = self.spec()
        run = {"model": {"path": str(s.model_path), "id": s.model_id}, "corpus": s.corpus_id,
               "method": s.method.as_dict()}
        outputs.commit(self.out_dir(), {"task": self.task_family, "identity": self.identity(), "run": run,
                                        "elapsed_s": time.time() - self.started + self.earlier_s,
                                        "attempts": self.earlier_attempts + 1, "peak_rss_mb": peak_rss_mb(),
                                        "seconds": dict(self.clock.seconds), **manifest},
                       on_written=lambda: failpoint("manifest-written", self.label()), held=self.held)
        failpoint("task-committed", self.label())

    def label(self) -> str:
        return self.task_family

    def fill(self, path: Path, shape: tuple[int, ...], dtype: str, read, load, finite: bool = True,
             write_behind: bool = False, part: str = "") -> dict:
        """Write the chunks of this task's array at `path` that are missing or damaged
        (store/chunk_writer.py), resuming what an interrupted run of this task left; with
        `finite`, a chunk holding a NaN or inf stops the task instead of being written; with
        `write_behind`, a chunk is written while the next computes; `part` names the array in
        the progress lines of a task that fills several."""
        import torch

        from ..store.chunk_writer import fill, resumable_array

        out = resumable_array(path, shape, self.sequences_per_chunk, dtype,
                              {"identity": self.identity(), "output": self.out_dir().name})
        label = f"{self.label()} {part}".strip()
        try:
            return fill(out, read, load, label, self.clock,
                        progress=lambda *args: console.show_progress(self, label, *args),
                        check=self.require_finite if finite else None, write_behind=write_behind)
        except torch.OutOfMemoryError as e:
            cause = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
            raise UserError(f"{label}: the device ran out of memory ({cause}); the chunks completed are kept: "
                            f"rerun with a smaller --device-memory or --sequences-per-chunk") from None

    def require_finite(self, i: int, values: np.ndarray) -> None:
        """A NaN or inf is never a result: the pass stops, naming the task and the chunk."""
        # one summing pass finds it (a NaN or inf propagates); the exact test only when the sum is not finite
        if np.isfinite(values.sum()) or np.isfinite(values).all():
            return
        raise UserError(f"{self.label()}: a NaN or inf in chunk {i} of its output; the model file's weights or "
                        f"the compute dtype's range give no finite number there")


def chain_failure(tasks) -> tuple | None:
    """(task, why) of the first of `tasks` that is not complete because its last attempt failed
    while it ran (recorded beside its output), or None."""
    return next(((t, reason) for t in tasks if not t.complete() and (reason := t.failure())), None)


def under_root(root, task) -> str:
    """A task's output folder as a path under the run root."""
    return str(task.out_dir().relative_to(root))


