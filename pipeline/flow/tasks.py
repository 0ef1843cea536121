"""Luigi tasks: Tokenize -> Embed -> LayerWindow (one per window) -> Score -> PerplexityRun.

Tasks are thin: parameters, `requires`, `output`, `run`; the work lives in the modules they
call. Each output folder is named by a hash of everything that changes its numbers plus the
hashes of its upstream outputs, so a changed option can never reuse a stale result.
"""
import contextlib
import hashlib
import json
import logging
import socket
import time
from pathlib import Path

import luigi
import numpy as np
from gguf import Keys

from ..errors import UserError
from ..numerics import numerics_identity
from ..paths import RUNS, location
from ..run import cuda_probe
from ..run.placement import (
    check_tiling,
    format_placement,
    pack_windows,
    parse_placement,
    parse_window_layers,
    plan_placement,
    resolve_device,
)
from ..run.spec import resolve_run
from ..store import outputs
from ..store.faults import failpoint
from ..store.timing import Stopwatch, device_peaks_mb, peak_rss_mb, reset_device_peak, reset_peak_rss
from . import console

log = logging.getLogger("layercycle")


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
    windows_per_chunk = luigi.IntParameter(default=4, description="sequences per Zarr chunk and batch")
    run_root = luigi.Parameter(default=str(RUNS), description="folder for all outputs")
    keep_boundaries = luigi.BoolParameter(default=False, significant=False,
                                          description="keep boundaries after their consumer completed")

    def __init__(self, *args, **kwargs):
        console.install()  # a process that makes tasks runs them: its console is set up once
        super().__init__(*args, **kwargs)

    def spec(self):
        return resolve_run(self.model, self.task, self.corpus, self.tokens_file, self.method, self.ctx,
                           self.stride, self.unscored_prefix, self.chunks, self.bos)


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
        with outputs.disk_errors(self.run_root), outputs.locked(self.out_dir(), self.task_family, wait=shared):
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
        if self.windows_per_chunk < 1:
            raise UserError(f"--windows-per-chunk must be >= 1, got {self.windows_per_chunk}")
        return outputs.begin(self.out_dir(), {"task": self.task_family, **self.to_str_params(),
                                              "identity": self.identity()})

    def commit(self, **manifest) -> None:
        s = self.spec()
        run = {"model": {"path": str(s.model_path), "sha256": s.model_sha256}, "corpus": s.corpus_id,
               "method": s.method.as_dict()}
        outputs.commit(self.out_dir(), {"task": self.task_family, "identity": self.identity(), "run": run,
                                        "elapsed_s": time.time() - self.started, "peak_rss_mb": peak_rss_mb(),
                                        "seconds": dict(self.clock.seconds), **manifest},
                       on_written=lambda: failpoint("manifest-written", self.label()))
        failpoint("task-committed", self.label())

    def label(self) -> str:
        return self.task_family


class Tokenize(OutputTask):
    def requires(self):
        return []

    def identity(self):
        s = self.spec()
        return {"tokenizer": s.tokenizer_id, "corpus": s.corpus_id, "method": s.method.as_dict(),
                "windows_per_chunk": self.windows_per_chunk, **numerics_identity()}

    def execute(self):
        from ..gguf_io.reader import open_gguf
        from ..gguf_io.tokenizer import load_tokenizer
        from ..run.corpus_plan import plan_sequences
        from ..run.evaltask import corpus_text
        from ..run.spec import read_tokens_file
        from ..store.arrays import save_plan

        s = self.spec()
        work = self.begin()
        if s.tokens_file:
            tokens = read_tokens_file(s.tokens_file)
        else:
            text, _ = corpus_text(s.eval_task, s.corpus)
            tokens = np.array(load_tokenizer(open_gguf(str(s.model_path))).encode(text, add_bos=s.method.bos),
                              dtype=np.int32)
        vocab = s.gguf.metadata[Keys.Tokenizer.LIST].count
        if tokens.size and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
            raise UserError(f"token ids range over [{tokens.min()}, {tokens.max()}], outside the vocabulary of {vocab}")
        plan = plan_sequences(tokens, s.method, s.bos_id)
        attrs = {"n_tokens": int(tokens.size), "available_windows": plan.available, "corpus": s.corpus_id,
                 "method": s.method.as_dict()}
        save_plan(work / "tokens.zarr", tokens, plan, self.windows_per_chunk, attrs)
        log.info(f"Tokenize: {tokens.size:,} tokens, {plan.n_sequences} of {plan.available} sequences of "
                 f"{s.method.ctx}, {plan.tokens_scored:,} tokens to score")
        # manifest keys as every Tokenize output so far has them
        self.commit(n_tokens=int(tokens.size), n_windows=plan.n_sequences,
                    available_windows=plan.available, tokens_scored=plan.tokens_scored)


class PlacedTask(OutputTask):
    """A task that belongs to one layer placement."""
    placement = luigi.Parameter(description="layer windows, e.g. cpu:0:4,cpu:4:8 (set by PerplexityRun)")
    compute_dtype = luigi.ChoiceParameter(choices=["auto", "float32", "bfloat16", "float16"], default="auto",
                                          description="auto: float32 on the CPU, bfloat16 on CUDA")
    boundary_dtype = luigi.ChoiceParameter(choices=["float32", "bfloat16", "float16"], default="float32",
                                           description="how boundaries are stored on disk")
    shards = luigi.IntParameter(default=1, description="independent chains the corpus is split into")
    shard = luigi.IntParameter(default=0, description="which of them this task belongs to")
    device_memory = luigi.Parameter(default="", significant=False,
                                    description="what the device may hold, e.g. 12GiB (set by PerplexityRun)")

    def windows(self):
        return parse_placement(self.placement)

    def shard_sequences(self, n_sequences: int) -> range:
        """The sequences of this task's shard: whole Zarr chunks, so that every batch, and
        so every number, is the one a single chain computes."""
        n_chunks = -(-n_sequences // self.windows_per_chunk)
        first, last = (n_chunks * k // self.shards * self.windows_per_chunk for k in (self.shard, self.shard + 1))
        return range(first, min(last, n_sequences))

    def numerics_identity(self) -> dict:
        """The version of what computes this output: the package's and the model family's."""
        from ..model.arch import ARCHITECTURES

        return numerics_identity(ARCHITECTURES[self.spec().gguf.architecture].numerics)

    def shard_identity(self) -> dict:
        return {"shard": [self.shard, self.shards]} if self.shards > 1 else {}

    def device_identity(self) -> dict:
        """The device type that computes this output: a CUDA output is never taken for a CPU one
        (the same dtype does not give the same numbers on both). The CPU, which every output
        before this key was computed on, adds nothing, so those outputs keep their names."""
        return {"device": self.device()} if self.device() != "cpu" else {}

    def device(self) -> str:
        return "cpu"

    @property
    def resources(self) -> dict:
        """A task placed on CUDA holds one `gpu` of the scheduler's pool (configs/luigid.cfg)."""
        return {"gpu": 1} if self.device() == "cuda" else {}

    def hold_to_budget(self, device: str) -> None:
        """On CUDA --device-memory is a hard limit: past it torch's allocator fails as a smaller
        card would (on the CPU it only sizes the windows)."""
        if device.startswith("cuda") and self.device_memory:
            import torch

            from ..run.preflight import parse_size

            total = torch.cuda.get_device_properties(device).total_memory
            torch.cuda.set_per_process_memory_fraction(min(1.0, parse_size(self.device_memory) / total), device)

    def complete(self) -> bool:
        # a boundary removed once its consumer completed must be recomputed for a new consumer
        return super().complete() and not outputs.read_manifest(self.out_dir()).get("boundary_removed")

    def source_task(self):
        """The task whose boundary this one consumes."""
        return self.requires()

    def inputs_read(self) -> list:
        return [t for t in luigi.task.flatten(self.requires()) if isinstance(t, PlacedTask)]

    def prepare(self) -> None:
        from ..model.process import prepare_for_compute

        prepare_for_compute()

    def release_input(self) -> None:
        """Remove the boundary this task consumed, now that its own output is complete; it stays
        while another consumer (of any process) reads it, and a later one recomputes it. A KL
        base's last boundary stays for every run compared with it (PerplexityRun.score_tasks
        marks it), the base's own run included."""
        source = self.source_task()
        if isinstance(source, PlacedTask) and not self.keep_boundaries and not outputs.is_kept(source.out_dir()):
            outputs.remove_data(source.out_dir(), "boundary.zarr", "boundary_removed")

    def dtype_name(self, device: str) -> str:
        return compute_dtype_name(self.compute_dtype, device)

    def boundary_task(self, last: int):
        """The task whose output is the boundary at layer `last`."""
        if last == 0:
            return self.clone(Embed)
        window = next(w for w in self.windows() if w.last == last)
        return self.clone(LayerWindow, first=window.first, last=window.last)

    def input_boundary(self, upstream=None):
        """The boundary this task reads (of `upstream`, by default the one it consumes), checked
        to be the one that task wrote."""
        from ..store.arrays import ChunkedArray

        upstream = upstream or self.source_task()
        boundary = ChunkedArray.open(upstream.out_dir() / "boundary.zarr")
        if boundary.attrs.get("output") != upstream.out_dir().name:
            raise UserError(f"{boundary.path} was written by another run (output "
                            f"{boundary.attrs.get('output')}), not by {upstream.label()} of this one")
        return boundary

    def plan(self):
        """(the corpus plan, its attributes), read once per task: it does not change while the task runs."""
        from ..store.arrays import load_plan

        if "_plan" not in self.__dict__:
            self._plan = load_plan(self.clone(Tokenize).out_dir() / "tokens.zarr")
        return self._plan

    def chunk_ids(self, i: int):
        """The token ids [sequences, ctx] of chunk i of this task's shard, int64."""
        import torch

        plan, _ = self.plan()
        mine, per = self.shard_sequences(plan.n_sequences), self.windows_per_chunk
        return torch.from_numpy(plan.ids[mine.start + i * per:min(mine.start + (i + 1) * per, mine.stop)]
                                .astype(np.int64))

    def fill(self, path: Path, shape: tuple[int, ...], dtype: str, read, load, finite: bool = True,
             write_behind: bool = False, part: str = "") -> dict:
        """Write the chunks of this task's array at `path` that are missing or damaged
        (store/chunk_writer.py), resuming what an interrupted run of this task left; with
        `finite`, a chunk holding a NaN or inf stops the task instead of being written; with
        `write_behind`, a chunk is written while the next computes; `part` names the array in
        the progress lines of a task that fills several."""
        import torch

        from ..store.chunk_writer import fill, resumable_array

        out = resumable_array(path, shape, self.windows_per_chunk, dtype,
                              {"identity": self.identity(), "output": self.out_dir().name})
        label = f"{self.label()} {part}".strip()
        try:
            return fill(out, read, load, label, self.clock,
                        progress=lambda *args: console.show_progress(self, label, *args),
                        check=self.require_finite if finite else None, write_behind=write_behind)
        except torch.OutOfMemoryError as e:
            cause = str(e).strip().splitlines()[0] if str(e).strip() else "out of memory"
            raise UserError(f"{label}: the device ran out of memory ({cause}); the chunks completed are kept: "
                            f"rerun with a smaller --device-memory or --windows-per-chunk") from None

    def require_finite(self, i: int, values: np.ndarray) -> None:
        """A NaN or inf is never a result: the pass stops, naming the task and the chunk."""
        # one summing pass finds it (a NaN or inf propagates); the exact test only when the sum is not finite
        if np.isfinite(values.sum()) or np.isfinite(values).all():
            return
        raise UserError(f"{self.label()}: a NaN or inf in chunk {i} of its output; the model file's weights or "
                        f"the compute dtype's range give no finite number there")


class Embed(PlacedTask):
    def requires(self):
        return self.clone(Tokenize)

    def identity(self):
        return {"model": self.spec().model_sha256, "boundary_dtype": self.boundary_dtype, **self.shard_identity(),
                **self.numerics_identity()}

    def execute(self):
        import torch

        from ..model.arch import load_architecture
        from ..run.preflight import check_disk

        s = self.spec()
        work = self.begin()
        arch = load_architecture(s.gguf)
        plan, _ = self.plan()
        mine = self.shard_sequences(plan.n_sequences)
        shape = (len(mine), s.method.ctx, arch.hp.hidden)
        alive = len(self.windows()) + 1 if self.keep_boundaries else 2  # boundaries on disk at once
        # a window in expert slices keeps, as float32, its staged layer (two hidden states a
        # token) and two accumulators (one each) while it runs
        sliced = 4 * 4 * int(np.prod(shape)) if any(w.expert_slices > 1 for w in self.windows()) else 0
        widest = max(arch.boundary_width(w.last) for w in self.windows())   # a boundary may carry more than hidden
        check_disk((*shape[:2], widest), self.boundary_dtype, alive, outputs.free_bytes(location(self.run_root)),
                   self.run_root, sliced)

        def compute(i, ids):
            return arch.embed(ids, "cpu", torch.float32).numpy()

        self.commit(**self.fill(work / "boundary.zarr", shape, self.boundary_dtype, self.chunk_ids, lambda: compute))


class LayerWindow(PlacedTask):
    first = luigi.IntParameter()
    last = luigi.IntParameter()
    reuses_weights = True

    def requires(self):
        return self.boundary_task(self.first)

    def window(self):
        return next(w for w in self.windows() if w.first == self.first)

    def device(self) -> str:
        return self.window().device

    def identity(self):
        return {"model": self.spec().model_sha256, "layers": [self.first, self.last],
                "compute_dtype": self.dtype_name(self.device()), "boundary_dtype": self.boundary_dtype,
                **self.shard_identity(), **self.device_identity(), **self.numerics_identity()}

    def label(self):
        return f"LayerWindow [{self.first}..{self.last}) {self.device()}"

    def pass_position(self) -> tuple[int, int, int, int]:
        """(layers before this window, in it, in the trunk, runs of a sweep after this one), for
        the pass-level progress line; the runs still to come are read from the outputs on disk,
        so every worker of a sweep, on any host, counts the same."""
        from .sweep import runs_done, sweeps_with

        mine = _under(location(self.run_root), self)
        if "_sweeps" not in self.__dict__:  # the records do not change while the task runs
            self._sweeps = sweeps_with(self.run_root, mine)
        after = max((sum(not done and mine not in run["outputs"]
                         for run, done in zip(record["runs"], runs_done(self.run_root, record)))
                     for record in self._sweeps), default=0)
        return self.first, self.last - self.first, self.windows()[-1].last, after

    def execute(self):
        import torch

        from ..gguf_io.dequant import FILE_BYTES_READ, READ_WAIT_S
        from ..model.arch import load_architecture
        from ..model.executor import WindowExecutor
        from ..run.preflight import layer_weight_bytes

        device = resolve_device(self.device())
        self.hold_to_budget(device)
        reset_device_peak(device)
        work = self.begin()
        source = self.input_boundary()
        dtype = getattr(torch, self.dtype_name(device))
        slices, read_before, wait_before = self.window().expert_slices, FILE_BYTES_READ[0], READ_WAIT_S[0]
        loaded = []

        arch = load_architecture(self.spec().gguf)

        def load():
            # this window's pages read at once: the disk reads ahead of the dequantization
            self.read_ahead(self.layer_tensor_names(self.first, self.last))
            loaded.append(WindowExecutor(arch, self.first, self.last, device, dtype))
            self.read_ahead_next()
            return lambda i, chunk: loaded[0](torch.from_numpy(chunk[0]), ids=chunk[1]).numpy()

        if slices > 1:
            stats = self.fill_in_slices(work, source, device, dtype, slices, loaded)
        else:  # on CUDA a chunk's compression and checksum would hold the GPU idle: written behind
            n, ctx, _ = source.array.shape
            stats = self.fill(work / "boundary.zarr", (n, ctx, arch.boundary_width(self.last)), self.boundary_dtype,
                              lambda i: (source.read_chunk(i), self.chunk_ids(i) if arch.takes_token_ids else None),
                              load, write_behind=device.startswith("cuda"))
        peaks = device_peaks_mb(device)
        if loaded:
            loaded[0].release()
            weight_bytes = loaded[0].weight_bytes
        else:  # every chunk was there already: the weights were never loaded
            weight_bytes = sum(layer_weight_bytes(self.spec().gguf, i, dtype)
                               for i in range(self.first, self.last))
        self.commit(device=device, weight_bytes=weight_bytes, expert_slices=slices,
                    weight_file_bytes_read=FILE_BYTES_READ[0] - read_before,
                    weight_read_wait_s=round(READ_WAIT_S[0] - wait_before, 3), **peaks, **stats)

    def read_ahead(self, names: list[str]) -> None:
        """These tensors' file pages read into the page cache in the background, at most half
        the host memory available now, so pages read ahead never push out those in use. A
        file bigger than that cannot stay in the page cache: each tensor's pages are dropped
        from it once used, so they never crowd out those read ahead."""
        from ..run.preflight import available_bytes

        gguf, room = self.spec().gguf, available_bytes("cpu") // 2
        gguf.forget_used = gguf.n_bytes > room
        gguf.read_ahead(names, room)

    def read_ahead_next(self) -> None:
        """While this window computes, the file pages of the next window (or, after the last
        one, of the LM head) are read into the page cache, so a cold pass waits on the disk for
        the first window only."""
        gguf = self.spec().gguf
        after = [w for w in self.windows() if w.first == self.last]
        if after:
            names = self.layer_tensor_names(after[0].first, after[0].last)
        else:
            names = ["output.weight" if "output.weight" in gguf.tensors else "token_embd.weight"]
        self.read_ahead(names)

    def layer_tensor_names(self, first: int, last: int) -> list[str]:
        gguf = self.spec().gguf
        return [t.name for i in range(first, last) for t in gguf.layer_tensors(i)]

    def fill_in_slices(self, work: Path, source, device: str, dtype, slices: int, loaded: list) -> dict:
        """The one layer of this window with its routed experts in slices (model/sliced.py),
        slices outside and chunks inside: the layer up to its MoE and the routing over every
        chunk (staged.zarr), then each slice of experts over every chunk, added into a float32
        accumulator (experts-J.zarr; a slice's `.done` mark written once it is whole, the
        accumulator before it then removed), then the rest of the layer into the boundary.
        Every array resumes chunk by chunk; each slice's experts are read once per pass."""
        import torch

        from ..model.arch import load_architecture
        from ..model.arch.experts import expert_tensor_names, slice_firsts
        from ..model.sliced import SlicedLayer
        from ..store.arrays import ChunkedArray

        def layer() -> SlicedLayer:
            if not loaded:
                loaded.append(SlicedLayer(load_architecture(self.spec().gguf), self.first, device, dtype, slices))
            return loaded[0]

        gguf = self.spec().gguf
        n, ctx, H = source.array.shape
        as_tensor = lambda chunks: [torch.from_numpy(c) for c in chunks]  # noqa: E731
        self.fill(work / "staged.zarr", (n, ctx, layer().width), "float32", source.read_chunk,
                  lambda: lambda i, x: layer().stage(torch.from_numpy(x)).numpy(), finite=False, part="attention")
        staged = ChunkedArray.open(work / "staged.zarr")
        firsts = slice_firsts(gguf.tensors[expert_tensor_names(gguf, self.first)["down"]].shape[0], slices)
        before = None                                   # the accumulator of the slices so far
        for j, a in enumerate(firsts):
            acc, done = work / f"experts-{j}.zarr", work / f"experts-{j}.done"
            if not done.exists():
                def read(i, so_far=before and ChunkedArray.open(before)):
                    rows = staged.read_chunk(i)
                    return rows, so_far.read_chunk(i) if so_far else np.zeros((*rows.shape[:2], H), np.float32)

                def load(a=a):
                    layer().load_slice(a)
                    return lambda i, chunks: layer().add_slice(*as_tensor(chunks)).numpy()

                self.fill(acc, (n, ctx, H), "float32", read, load, finite=False,
                          part=f"experts {j + 1}/{len(firsts)}")
                done.write_text("")
            if before:
                outputs.remove_tree(before)
            before = acc
        summed = ChunkedArray.open(before)
        stats = self.fill(work / "boundary.zarr", source.array.shape, self.boundary_dtype,
                          lambda i: (source.read_chunk(i), staged.read_chunk(i), summed.read_chunk(i)),
                          lambda: lambda i, chunks: layer().finish(*as_tensor(chunks)).numpy(),
                          write_behind=device.startswith("cuda"))
        outputs.remove_tree(work / "staged.zarr")
        outputs.remove_tree(before)
        for j in range(len(firsts)):
            (work / f"experts-{j}.done").unlink(missing_ok=True)
        return stats


class Score(PlacedTask):
    """Output norm + LM head over the last boundary: NLL per scored token, and with a KL base
    the per-token KL-divergence figures against the base's last boundary (kld.py)."""
    kl_base = luigi.Parameter(default="", description="base model of the KL-divergence (set by PerplexityRun)")
    base_placement = luigi.Parameter(default="", description="the base model's layer windows")

    def requires(self):
        return [self.source_task()] + ([self.base_task()] if self.kl_base else [])

    def source_task(self):
        return self.boundary_task(self.windows()[-1].last)

    def base_task(self):
        """The base model's last window, whose boundary stays for every run compared with it."""
        last = parse_placement(self.base_placement)[-1]
        return self.clone(LayerWindow, model=self.kl_base, placement=self.base_placement,
                          first=last.first, last=last.last)

    def device(self) -> str:
        return self.windows()[-1].device

    def identity(self):
        identity = {"model": self.spec().model_sha256, "compute_dtype": self.dtype_name(self.device()),
                    **self.shard_identity(), **self.device_identity(), **self.numerics_identity()}
        if self.kl_base:
            identity["kl_base"] = self.base_task().spec().model_sha256
        return identity

    def execute(self):
        import torch

        from ..model import kld
        from ..model.arch import load_architecture
        from ..model.scoring import sequence_scores

        device = resolve_device(self.device())
        self.hold_to_budget(device)
        reset_device_peak(device)
        dtype = getattr(torch, self.dtype_name(device))
        work = self.begin()
        plan, _ = self.plan()
        sources = [self.input_boundary()] + ([self.input_boundary(self.base_task())] if self.kl_base else [])
        n, ctx, _ = sources[0].array.shape
        offset = self.shard_sequences(plan.n_sequences).start
        fields = kld.FIELDS if self.kl_base else ("nll",)

        def load():
            ggufs = [self.spec().gguf] + ([self.base_task().spec().gguf] if self.kl_base else [])
            heads = [load_architecture(g).load_head(device, dtype) for g in ggufs]

            def compute(i, hidden):
                # [sequences in chunk, ctx, fields] float64: figures at scored target positions, NaN elsewhere
                hidden = [torch.from_numpy(h) for h in hidden]
                out = np.full((hidden[0].shape[0], ctx, len(fields)), np.nan)
                for j, local in enumerate(range(*sources[0].sequences(i).indices(n))):
                    s = offset + local
                    lo, hi = int(plan.score_lo[s]), int(plan.score_hi[s])
                    out[j, lo:hi] = sequence_scores(heads, [h[j] for h in hidden], plan.ids[s], lo, hi, device, dtype)
                    self.require_finite(i, out[j, lo:hi])
                return out
            return compute

        stats = self.fill(work / "tokens.zarr", (n, ctx, len(fields)), "float64",
                          lambda i: [s.read_chunk(i) for s in sources], load, finite=False)  # NaN: not scored
        self.commit(device=device, fields=list(fields), **device_peaks_mb(device), **stats)

    def scored(self) -> list[np.ndarray]:
        """The completed output: per sequence of the shard, [scored tokens, fields]."""
        plan, _ = self.plan()
        offset = self.shard_sequences(plan.n_sequences).start
        rows = _read_all(self.out_dir() / "tokens.zarr")
        return [row[plan.score_lo[w]:plan.score_hi[w]] for w, row in enumerate(rows, start=offset)]


def score_result(scores: list) -> dict:
    """PPL, per-sequence figures (and KLD) over the shards' Score outputs, in corpus order."""
    from ..model import kld
    from ..model.scoring import summarize

    scored = [rows for s in scores for rows in s.scored()]
    result = summarize([rows[:, 0] for rows in scored])
    if scores[0].kl_base:
        result["kld"] = kld.summarize(np.concatenate(scored))
    return result


def _read_all(path: Path) -> np.ndarray:
    from ..store.arrays import ChunkedArray

    store = ChunkedArray.open(path)
    return np.concatenate([store.read_chunk(i) for i in range(store.n_chunks)])


class WindowLayersParameter(luigi.Parameter):
    """--window-layers: a layer count or `auto`, the same value however it is written (8, "8")."""

    def normalize(self, x):
        return str(x).strip().lower()


class PerplexityRun(RunTask):
    """The entry point: places the layers, runs the chain, prints and writes the result."""
    window_layers = WindowLayersParameter(
        default="auto", description="layers per window (0: the whole trunk at once; auto: the longest that fit)")
    gpu_layers = luigi.IntParameter(default=-1, description="layers on the device; the rest run on the CPU")
    first_layer = luigi.IntParameter(default=0, description="with --gpu-layers: first layer on the device")
    cycle = luigi.BoolParameter(default=False, description="with --gpu-layers N: a device window of N layers "
                                                           "slid across the whole trunk")
    device = luigi.ChoiceParameter(choices=["auto", "cpu", "cuda"], default="auto", significant=False,
                                   description="device for the placed windows")
    device_memory = luigi.Parameter(default="", significant=False,
                                    description="what the device may hold, e.g. 12GiB (default: what it has)")
    compute_dtype = luigi.ChoiceParameter(choices=["auto", "float32", "bfloat16", "float16"], default="auto")
    boundary_dtype = luigi.ChoiceParameter(choices=["float32", "bfloat16", "float16"], default="float32")
    per_window = luigi.BoolParameter(default=False, description="print each sequence's mean NLL and the running PPL")
    result_json = luigi.Parameter(default="", significant=False, description="write the result as JSON here")
    dump_tokens = luigi.Parameter(default="", significant=False,
                                  description="write the corpus's token ids as the run tokenized them here "
                                              "(.npy, or whitespace-separated ids: what --tokens-file reads)")
    kl_base = luigi.Parameter(default="", description="KL-divergence against this base model "
                                                      "(alias, GGUF path, or the result JSON of its run)")
    shards = luigi.IntParameter(default=1, description="split the corpus into this many independent chains "
                                                       "(each reads every layer's weights once)")

    def placement(self, check_memory: bool = True, kl_base_head=None) -> list:
        """The layer windows; before a pass (not when reporting one) checked against memory, with
        the KL base's head (a GGUFIndex) beside the model's in the Score task. Auto-sized windows
        depend on the model, the settings and the devices' budgets only (preflight.device_budget),
        so a rerun finds the windows of the run it resumes."""
        from ..model.arch import load_architecture
        from ..run import preflight

        s = self.spec()
        hp = load_architecture(s.gguf).hp
        device = resolve_device(self.device)
        caps = {device: preflight.parse_size(self.device_memory)} if self.device_memory else {}
        dtypes = {d: compute_dtype_name(self.compute_dtype, d) for d in {device, "cpu"}}
        heads = [s.gguf] + ([kl_base_head] if kl_base_head is not None else [])
        ends_on_cpu = self.gpu_layers >= 0 and self.first_layer + self.gpu_layers < hp.n_layers

        def pack(dev: str, first: int, last: int) -> list:
            import torch

            dtype = getattr(torch, dtypes[dev])
            per_layer, experts = preflight.layer_costs(s.gguf, hp.n_layers, dtype, range(first, last))
            what = "--device-memory" if dev in caps else f"the {dev} budget ({preflight.AUTO_SHARE[dev]:.0%} of it)"
            score_here = dev == ("cpu" if ends_on_cpu else device)   # the Score task runs on the last window's device
            floor = preflight.heads_need(heads, dtype.itemsize)[0] if score_here else 0
            fixed = preflight.window_fixed_bytes(s.gguf, self.windows_per_chunk, s.method.ctx, hp.n_head, dev)
            return pack_windows(per_layer, fixed, preflight.device_budget(dev, caps.get(dev)), first, last, dev,
                                what, experts, floor)

        windows = plan_placement(hp.n_layers, parse_window_layers(self.window_layers), self.gpu_layers,
                                 self.first_layer, device, pack, self.cycle)
        if self.window_layers == "auto" and not self.device_memory:
            with outputs.disk_errors(self.run_root):
                windows = self.recorded_placement(windows, device, dtypes)
        check_tiling(windows, hp.n_layers)
        if check_memory:
            preflight.check_memory(s.gguf, windows, hp.n_layers, hp.n_head, self.windows_per_chunk, s.method.ctx,
                                   {w.device: dtypes[w.device] for w in windows},
                                   heads=heads, caps=caps)
        return windows

    def recorded_placement(self, windows: list, device: str, dtypes: dict) -> list:
        """Auto windows sized from this host's memory, unless the run root records the windows
        a first planner chose for the same model and settings: then those, so that workers on
        hosts with other memory plan the same windows and share every output."""
        s = self.spec()
        key = {"model": s.model_sha256, "device": device, "dtypes": dtypes, "gpu_layers": self.gpu_layers,
               "first_layer": self.first_layer, "ctx": s.method.ctx, "windows_per_chunk": self.windows_per_chunk,
               **({"cycle": True} if self.cycle else {})}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
        path = location(self.run_root) / ".placements" / f"{digest}.json"
        record = outputs.record_once(path, {**key, "placement": format_placement(windows),
                                            "planned_on": socket.gethostname()})
        return parse_placement(record["placement"])

    def base_model(self) -> str:
        """--kl-base as a model: a result JSON names the model of its run."""
        if self.kl_base.endswith(".json") and Path(self.kl_base).is_file():
            return json.loads(Path(self.kl_base).read_text())["model"]["path"]
        return self.kl_base

    def score_tasks(self, check_memory: bool = True) -> list:
        """The Score task of each shard (one unless --shards)."""
        if self.shards < 1:
            raise UserError(f"--shards must be >= 1, got {self.shards}")
        base = self.clone(PerplexityRun, model=self.base_model(), kl_base="") if self.kl_base else None
        if base is not None and base.spec().tokenizer_id != self.spec().tokenizer_id:
            raise UserError(f"--kl-base {self.kl_base}: its tokenizer differs from the model's; KL-divergence "
                            f"compares distributions over the same vocabulary")
        params = {"placement": format_placement(self.placement(check_memory, base and base.spec().gguf))}
        if base is not None:
            params |= {"kl_base": base.model, "base_placement": format_placement(base.placement(check_memory))}
        scores = [self.clone(Score, shard=k, **params) for k in range(self.shards)]
        with outputs.disk_errors(self.run_root):
            for score in scores if base is not None else []:
                outputs.keep_data(score.base_task().out_dir(), f"the KL base of {self.model}")
        return scores

    def requires(self):
        try:
            return self.score_tasks()
        except UserError:
            return []  # run() reports it

    def complete(self) -> bool:
        return False  # always prints its report, from the cached chain when that is complete

    def result(self) -> dict:
        """The result of the completed chain (README: "Options", the JSON keys)."""
        from .report import build_result

        scores = self.score_tasks(check_memory=False)
        windows = scores[0].windows()
        chain = _chain(scores)
        dtypes = sorted({scores[0].dtype_name(w.device) for w in windows})
        numerics = {"compute_dtype": "/".join(dtypes), "boundary_dtype": self.boundary_dtype, "shards": self.shards}
        return build_result(self.spec(), windows, scores, score_result(scores), chain, numerics)

    def run(self):
        from .report import print_report

        if not all(t.complete() for t in self.score_tasks(check_memory=False)):
            self.score_tasks()  # requires() found no chain to run: say why (the memory preflight)
        result = self.result()
        print_report(result, per_window=self.per_window)
        if self.result_json:
            path = location(self.result_json)
            path.parent.mkdir(parents=True, exist_ok=True)
            outputs.write_json(path, result)
        if self.dump_tokens:
            from ..run.spec import write_tokens_file
            from ..store.arrays import load_tokens

            write_tokens_file(self.dump_tokens, load_tokens(self.clone(Tokenize).out_dir() / "tokens.zarr"))


def compute_dtype_name(choice: str, device: str) -> str:
    """--compute-dtype auto is float32 on the CPU (exact) and bfloat16 on CUDA, float16 on a GPU
    without bfloat16 (a value out of its range stops the pass: NaN or inf is never a result)."""
    if choice != "auto":
        return choice
    if device == "cpu":
        return "float32"
    return "bfloat16" if cuda_probe.cuda_facts()["bf16"] else "float16"


def _chain(tasks: list) -> list:
    """The tasks and every task upstream of them, each output once, as first met: a run's own
    chain before its KL base's, which shares the Tokenize task."""
    chain = {}
    for task in tasks:
        for t in [task] + _chain(luigi.task.flatten(task.requires())):
            chain.setdefault(t.out_dir(), t)
    return list(chain.values())


class Sweep(luigi.Task):
    """A grid of runs from a sweep file (flow/sweep.py); writes CSV, Markdown and plots. A grid
    point that is refused is a row with its reason, never the end of the sweep; the sweep then
    exits non-zero, naming the refused points, after every other point was computed."""
    config = luigi.Parameter(description="sweep file, e.g. configs/sweeps/example.toml")
    run_root = luigi.Parameter(default=str(RUNS), description="folder for all outputs")

    def __init__(self, *args, **kwargs):
        console.install()
        super().__init__(*args, **kwargs)

    def points(self) -> list[tuple[dict, list | str]]:
        """(parameters, Score tasks) of each grid point, or (parameters, the reason it was refused)."""
        from .sweep import grid, load_sweep, parse_point, record_runs

        if "_points" not in self.__dict__:
            self._points = []
            for params in grid(load_sweep(self.config)):
                try:
                    run = PerplexityRun(run_root=self.run_root, **parse_point(PerplexityRun, params))
                    self._points.append((params, run.score_tasks()))
                except UserError as e:
                    self._points.append((params, str(e)))
            root = location(self.run_root)
            with outputs.disk_errors(self.run_root):
                record_runs(self.run_root, self.config, [
                    {"scores": [_under(root, s) for s in scores],
                     "outputs": [_under(root, t) for t in _chain(scores) if t.model == scores[0].model]}
                    for _, scores in self._points if not isinstance(scores, str)])
        return self._points

    def requires(self):
        try:
            points = self.points()
        except UserError:
            return []  # run() reports it
        scores = [s for _, p in points if not isinstance(p, str) for s in p]
        computed = [p for _, p in points if not isinstance(p, str)]
        done = sum(all(s.complete() for s in p) for p in computed)
        log.info(f"Sweep: {len(points)} runs, {done} already done"
                 + (f", {len(points) - len(computed)} refused" if len(computed) < len(points) else ""))
        return scores

    def complete(self) -> bool:
        return False  # always writes its tables, from the cached runs

    def run(self):
        from ..gguf_io.reader import open_gguf
        from .sweep import load_sweep, parse_point, refused_row, table_row, write_plots, write_tables

        out = load_sweep(self.config)["out"]
        rows = []
        for params, scores in self.points():
            if isinstance(scores, str):
                rows.append(refused_row(params, scores))
                continue
            result = PerplexityRun(run_root=self.run_root, **parse_point(PerplexityRun, params)).result()
            rows.append(table_row(result, open_gguf(result["model"]["path"])))
        write_tables(rows, out)
        plots = write_plots(rows, out)
        print("\n" + (out / "sweep.md").read_text())
        print(f"{len(rows)} runs: {', '.join(str(p) for p in [out / 'sweep.csv', out / 'sweep.md', *plots])}")
        refused = [r for r in rows if r["status"] == "refused"]
        if refused:
            raise UserError(f"{len(refused)} of {len(rows)} runs of the sweep were refused "
                            f"({', '.join(r['model'] for r in refused)}); the table gives each reason")


def _under(root, task) -> str:
    """A task's output folder as a path under the run root."""
    return str(task.out_dir().relative_to(root))


@Score.event_handler(luigi.Event.SUCCESS)
def _count_sweep_run(task) -> None:
    from .sweep import runs_done, sweeps_with

    for record in sweeps_with(task.run_root, _under(location(task.run_root), task)):
        done = runs_done(task.run_root, record)
        log.info(f"Sweep: {sum(done)}/{len(done)} runs done")
