"""The trunk: Tokenize (the evaluation mode's plan of sequences) -> Embed -> LayerWindow, one
per window of layers, each reading the previous boundary array and writing the next.

Tasks are thin: parameters, `requires`, `output`, `run`; the work lives in the modules they call.
"""
import functools
import json
import logging
import time
from pathlib import Path

import luigi
import numpy as np

from ..errors import UserError
from ..gguf_io.identity import boundary_tensors
from ..numerics import mode_identity, numerics_identity, set_numerics
from ..paths import location
from ..run import cuda_probe
from ..run.placement import (
    parse_placement,
    resolve_device,
)
from ..store import outputs
from ..store.faults import failpoint
from ..store.timing import device_peaks_mb, reset_device_peak
from .output_task import OutputTask, under_root

log = logging.getLogger("layercycle")
RECOUNT_S = 10.0    # how often a window task looks again at which runs of its sweeps are done
MODEL_FILES = "model-files.json"   # in a work folder: the model files its chunks were computed from


class Tokenize(OutputTask):
    def requires(self):
        return []

    def identity(self):
        from ..run.modes import BY_METHOD

        s = self.spec()
        mode = BY_METHOD[s.method.name]
        return {"tokenizer": s.tokenizer_id, "corpus": s.corpus_id, "method": s.method.as_dict(),
                "sequences_per_chunk": self.sequences_per_chunk, **numerics_identity(),
                **({"plan_version": mode.plan_version} if mode.plan_version > 1 else {}),
                **({"packed": True} if mode.packs(s) else {})}

    def execute(self):
        from ..run.modes import mode_of
        from ..store.arrays import save_plan

        s = self.spec()
        work = self.begin()
        made = mode_of(s.method.name).plan(s)
        tokens, plan = made.tokens, made.sequences
        attrs = {"n_tokens": int(tokens.size), "available_windows": plan.available, "corpus": s.corpus_id,
                 "method": s.method.as_dict(), "positions_computed": plan.positions_computed(self.sequences_per_chunk),
                 **made.attrs}
        save_plan(work / "tokens.zarr", tokens, plan, self.sequences_per_chunk, attrs)
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
    numerics = luigi.ChoiceParameter(choices=["exact", "llama-cpp"], default="exact",
                                     description="exact: the model's math on its dequantized weights; llama-cpp: "
                                                 "llama-perplexity's CPU arithmetic (8-bit activations, float16 KV)")
    shards = luigi.IntParameter(default=1, description="independent chains the corpus is split into")
    shard = luigi.IntParameter(default=0, description="which of them this task belongs to")
    device_memory = luigi.Parameter(default="", significant=False,
                                    description="what the device may hold, e.g. 12GiB (set by PerplexityRun)")

    def windows(self):
        return parse_placement(self.placement)

    def shard_sequences(self, n_sequences: int) -> range:
        """The sequences of this task's shard: whole Zarr chunks, so that every batch, and
        so every number, is the one a single chain computes."""
        n_chunks = -(-n_sequences // self.sequences_per_chunk)
        first, last = (n_chunks * k // self.shards * self.sequences_per_chunk for k in (self.shard, self.shard + 1))
        return range(first, min(last, n_sequences))

    def numerics_identity(self) -> dict:
        """The version of what computes this output: the package's and the model family's."""
        from ..model.arch import ARCHITECTURES

        return numerics_identity(ARCHITECTURES[self.spec().gguf.architecture].numerics)

    def mode_identity(self) -> dict:
        return mode_identity(self.numerics)

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
        if not super().complete():
            return False
        manifest = outputs.read_manifest(self.out_dir())
        # a boundary removed once its consumer completed must be recomputed for a new consumer
        return not manifest.get("boundary_removed") and self.same_weights(manifest)

    def weight_tensors(self) -> list[str]:
        """The model's tensors this output's numbers depend on (identity.boundary_tensors)."""
        raise NotImplementedError

    def weight_contents(self) -> dict:
        """The sha256 over the weights this output is computed from, as its manifest records it."""
        return {"content_sha256": self.spec().gguf.identity.content(self.weight_tensors())}

    def same_weights(self, manifest: dict) -> bool:
        """Whether the model file in hand holds the weights this output was computed from: a
        file with the identity of another (identity.py) never takes over that one's outputs."""
        identity = self.spec().gguf.identity
        unread = identity.unread_bytes(self.weight_tensors())
        if unread:
            log.info(f"{self.label()}: reading {unread / 2**30:,.2f} GiB of {self.spec().model_path.name} to check "
                     f"that it holds the weights output {self.out_dir().name} was computed from")
        contents = self.weight_contents()
        if unread:
            identity.save()   # a later run of this file reads nothing to know them
        if {k: manifest.get(k) for k in contents} == contents:
            return True
        if not self.__dict__.get("_told"):   # Luigi asks a task whether it is complete more than once
            self._told = True
            log.warning(f"{self.label()}: {self.spec().model_path.name} has the identity of the file its output "
                        f"{self.out_dir().name} was computed from, but other weights: it is computed again")
        return False

    def model_files(self) -> list:
        """The files (identity.file_instance) of the models whose weights this output reads."""
        return self.spec().gguf.identity.instance

    def begin(self) -> Path:
        """OutputTask.begin; chunks an earlier attempt computed from another file than the one in
        hand (a copy, an edited file) are dropped, not resumed."""
        work, files = outputs.partial_dir(self.out_dir()), self.model_files()
        if (work / MODEL_FILES).exists() and json.loads((work / MODEL_FILES).read_text()) != files:
            log.info(f"{self.label()}: the chunks computed so far were computed from another file; they are dropped")
            outputs.remove_tree(work)
        work = super().begin()
        outputs.write_json(work / MODEL_FILES, files)
        return work

    def commit(self, **manifest) -> None:
        contents = self.weight_contents()
        self.spec().gguf.identity.save()
        super().commit(**contents, **manifest)

    def source_task(self):
        """The task whose boundary this one consumes."""
        return self.requires()

    def inputs_read(self) -> list:
        return [t for t in luigi.task.flatten(self.requires()) if isinstance(t, PlacedTask)]

    def prepare(self) -> None:
        from ..model.process import prepare_for_compute

        prepare_for_compute()
        set_numerics(self.numerics, self.spec().gguf.architecture)

    def release_input(self) -> None:
        """Remove the boundary this task consumed, now that its own output is complete; it stays
        while another consumer (of any process) reads it, while a run of a sweep that is not done
        reads it with another task (two Scores over one trunk: a `kl_base` axis), and a later
        consumer recomputes it. A KL base's last boundary stays for every run compared with it
        (PerplexityRun.score_tasks marks it), the base's own run included."""
        source = self.source_task()
        if (isinstance(source, PlacedTask) and not self.keep_boundaries and not outputs.is_kept(source.out_dir())
                and not self.read_by_another_run(source)):
            outputs.remove_data(source.out_dir(), "boundary.zarr", "boundary_removed")

    def read_by_another_run(self, source) -> bool:
        """Whether a run recorded by a sweep under the run root, not done yet and not failed, has
        `source` in its chain and not this task: another of its tasks is still to read `source`."""
        from .sweep import runs_done, sweeps_with

        root = location(self.run_root)
        theirs, mine = under_root(root, source), under_root(root, self)
        for record in sweeps_with(self.run_root, theirs):
            for run, done in zip(record["runs"], runs_done(self.run_root, record), strict=True):
                failed = any(outputs.failure_record(root / score).exists() for score in run["scores"])
                if not done and not failed and theirs in run["outputs"] and mine not in run["outputs"]:
                    return True
        return False

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

    def chunk_rows(self, i: int) -> slice:
        """The plan's sequences of chunk i of this task's shard."""
        plan, _ = self.plan()
        mine, per = self.shard_sequences(plan.n_sequences), self.sequences_per_chunk
        return slice(mine.start + i * per, min(mine.start + (i + 1) * per, mine.stop))

    def live_length(self, i: int) -> int:
        """The positions of chunk i that a scored target needs: up to its sequences' last one. A
        choice task's padding after them is never computed (attention is causal: what comes before
        it is what the unpadded sequences give); a corpus's sequences are scored to their end."""
        if "_row_ends" not in self.__dict__:
            self._row_ends = self.plan()[0].row_ends()
        return int(self._row_ends[self.chunk_rows(i)].max())

    def fill(self, path: Path, shape: tuple[int, ...], dtype: str, read, load, **options) -> dict:
        """OutputTask.fill over each chunk's live positions (live_length), the rest of the chunk zeros."""
        ctx = shape[1]

        def trimmed_read(i):
            live = self.live_length(i)
            return read(i) if live == ctx else _trim(read(i), live, ctx)

        def trimmed_load():
            compute = load()

            def run(i, chunk):
                out = compute(i, chunk)       # [sequences, live, ...]
                return out if out.shape[1] == ctx else np.pad(out, [(0, 0), (0, ctx - out.shape[1])] +
                                                              [(0, 0)] * (out.ndim - 2))
            return run
        return super().fill(path, shape, dtype, trimmed_read, trimmed_load, **options)

    def chunk_ids(self, i: int):
        """The token ids [sequences, ctx] of chunk i of this task's shard, int64."""
        import torch

        plan, _ = self.plan()
        return torch.from_numpy(plan.ids[self.chunk_rows(i)].astype(np.int64))

    def chunk_layout(self, i: int):
        """The layout [sequences, ctx, LAYOUT_FIELDS] of chunk i's packed rows (int64), or None: rows
        of one sequence each."""
        import torch

        layout = self.plan()[0].layout
        return None if layout is None else torch.from_numpy(layout[self.chunk_rows(i)].astype(np.int64))


class Embed(PlacedTask):
    def requires(self):
        return self.clone(Tokenize)

    def identity(self):
        return {"model": self.spec().model_id, "boundary_dtype": self.boundary_dtype, **self.shard_identity(),
                **self.numerics_identity()}

    def weight_tensors(self) -> list[str]:
        return boundary_tensors(self.spec().gguf, 0)

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
        widest = max(arch.boundary_width(w.last) for w in self.windows())   # a boundary may carry more than hidden
        # a window in expert slices keeps, as float32, its staged layer (about two of the widest
        # boundaries a token: the blocks' outputs before the experts) and two accumulators
        sliced = 4 * 4 * shape[0] * shape[1] * widest if any(w.expert_slices > 1 for w in self.windows()) else 0
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
        return {"model": self.spec().model_id, "layers": [self.first, self.last],
                "compute_dtype": self.dtype_name(self.device()), "boundary_dtype": self.boundary_dtype,
                **self.shard_identity(), **self.device_identity(), **self.numerics_identity(), **self.mode_identity()}

    def label(self):
        return f"LayerWindow [{self.first}..{self.last}) {self.device()}"

    def weight_tensors(self) -> list[str]:
        return boundary_tensors(self.spec().gguf, self.last)

    def pass_position(self) -> tuple[int, int, int, int]:
        """(layers before this window, in it, in the trunk, runs of a sweep after this one), for
        the pass-level progress line; the runs still to come are read from the outputs on disk,
        so every worker of a sweep, on any host, counts the same: a run found done is not looked
        at again, the others at most every RECOUNT_S seconds (on an object store a look is a
        request a run, not to be made for every chunk)."""
        from .sweep import runs_done, sweeps_with

        mine = under_root(location(self.run_root), self)
        if "_sweeps" not in self.__dict__:  # the records do not change while the task runs
            self._sweeps, self._runs_done, self._looked = sweeps_with(self.run_root, mine), set(), -RECOUNT_S
        if time.monotonic() - self._looked >= RECOUNT_S:   # a look at the outputs costs a request a run on S3
            self._looked = time.monotonic()
            for k, record in enumerate(self._sweeps):
                todo = [i for i in range(len(record["runs"])) if (k, i) not in self._runs_done]
                done = runs_done(self.run_root, {"runs": [record["runs"][i] for i in todo]})
                self._runs_done |= {(k, i) for i, d in zip(todo, done, strict=True) if d}
        after = max((sum((k, i) not in self._runs_done and mine not in run["outputs"]
                         for i, run in enumerate(record["runs"]))
                     for k, record in enumerate(self._sweeps)), default=0)
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
            return lambda i, chunk: loaded[0](torch.from_numpy(chunk[0]), ids=chunk[1], layout=chunk[2]).numpy()

        try:
            if slices > 1:
                stats = self.fill_in_slices(work, source, device, dtype, slices, loaded)
            else:  # on CUDA a chunk's compression and checksum would hold the GPU idle: written behind
                n, ctx, _ = source.array.shape
                stats = self.fill(work / "boundary.zarr", (n, ctx, arch.boundary_width(self.last)),
                                  self.boundary_dtype,
                                  lambda i: (source.read_chunk(i), self.chunk_ids(i) if arch.takes_token_ids else None,
                                             self.chunk_layout(i)),
                                  load, write_behind=device.startswith("cuda"))
            peaks = device_peaks_mb(device)
            loading = {}
            if loaded:
                weight_bytes, loading = loaded[0].weight_bytes, loaded[0].loading()
        finally:   # a window that failed stops loading its layers too
            if loaded:
                loaded[0].release()
        if not loaded:  # every chunk was there already: the weights were never loaded
            weight_bytes = sum(layer_weight_bytes(self.spec().gguf, i, dtype)
                               for i in range(self.first, self.last))
        self.commit(device=device, weight_bytes=weight_bytes, expert_slices=slices, **loading,
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

    def fill_slices(self, work: Path, source, layer, firsts: list[int], with_rows, as_tensors) -> None:
        """The layer up to its MoE over every chunk (staged.zarr), then each slice of experts added
        into its accumulator (experts-J.zarr, marked `.done` once whole)."""
        from ..store.arrays import ChunkedArray

        n, ctx, _ = source.array.shape
        H = layer().hidden                              # the experts' width; a boundary may carry more
        self.fill(work / "staged.zarr", (n, ctx, layer().width), "float32",
                  lambda i: with_rows(i, source.read_chunk(i)),
                  lambda: lambda i, chunks: layer().stage(*as_tensors(chunks)).numpy(), finite=False, part="attention")
        staged = ChunkedArray.open(work / "staged.zarr")
        before = None                                   # the accumulator of the slices so far
        for j, a in enumerate(firsts):
            acc, done = work / f"experts-{j}.zarr", work / f"experts-{j}.done"
            if not done.exists():
                def read(i, so_far=before and ChunkedArray.open(before)):
                    rows = staged.read_chunk(i)
                    return rows, so_far.read_chunk(i) if so_far else np.zeros((*rows.shape[:2], H), np.float32)

                def load(a=a):
                    layer().load_slice(a)
                    return lambda i, chunks: layer().add_slice(*as_tensors(chunks)).numpy()

                self.fill(acc, (n, ctx, H), "float32", read, load, finite=False,
                          part=f"experts {j + 1}/{len(firsts)}")
                done.write_text("")
            if before:
                outputs.remove_tree(before)
            before = acc

    def fill_in_slices(self, work: Path, source, device: str, dtype, slices: int, loaded: list) -> dict:
        """The one layer of this window with its routed experts in slices (model/sliced.py),
        slices outside and chunks inside: the layer up to its MoE and the routing over every
        chunk (staged.zarr), then each slice of experts over every chunk, added into a float32
        accumulator (experts-J.zarr; a slice's `.done` mark written once it is whole, the
        accumulator before it then removed), then the rest of the layer into the boundary; once it
        is whole the layout is marked finished and the staged rows, accumulators and marks are
        removed. Every array resumes chunk by chunk, a kill while they are removed included; what
        was summed under another layout of slices (another budget) is dropped, never added to;
        each slice's experts are read once per pass."""
        import torch

        from ..model.arch import load_architecture
        from ..model.arch.experts import expert_tensor_names, slice_firsts
        from ..model.sliced import SlicedLayer
        from ..store.arrays import ChunkedArray

        gguf = self.spec().gguf
        arch = load_architecture(gguf)

        def layer() -> SlicedLayer:
            if not loaded:
                loaded.append(SlicedLayer(arch, self.first, device, dtype, slices))
            return loaded[0]

        n, ctx, _ = source.array.shape

        def with_rows(i, *arrays):   # a chunk's arrays, its ids where the family reads them, its rows' layout
            return (*arrays, self.chunk_ids(i) if arch.takes_token_ids else None, self.chunk_layout(i))

        def as_tensors(chunks):
            return [c if c is None or isinstance(c, torch.Tensor) else torch.from_numpy(c) for c in chunks]

        firsts = [int(a) for a in slice_firsts(gguf.tensors[expert_tensor_names(gguf, self.first)["down"]].shape[0],
                                               slices)]
        staged, summed = work / "staged.zarr", work / f"experts-{len(firsts) - 1}.zarr"
        # the slices' layout (another budget slices otherwise): what an earlier attempt summed in
        # another layout is dropped; `finished` once the boundary is whole, before the cleanup
        layout, recorded = work / "expert-slices.json", {}
        if layout.exists():
            recorded = json.loads(layout.read_text())
        if recorded.get("firsts") != firsts:
            for j in range(max(len(firsts), len(recorded.get("firsts", [])), slices)):
                outputs.remove_tree(work / f"experts-{j}.zarr")
                (work / f"experts-{j}.done").unlink(missing_ok=True)
            recorded = {"firsts": firsts, "finished": False}
            layout.write_text(json.dumps(recorded))
        if not recorded["finished"]:
            self.fill_slices(work, source, layer, firsts, with_rows, as_tensors)
        read = functools.cache(ChunkedArray.open)
        stats = self.fill(work / "boundary.zarr", (n, ctx, arch.boundary_width(self.last)), self.boundary_dtype,
                          lambda i: with_rows(i, source.read_chunk(i), read(staged).read_chunk(i),
                                             read(summed).read_chunk(i)),
                          lambda: lambda i, chunks: layer().finish(*as_tensors(chunks)).numpy(),
                          write_behind=device.startswith("cuda"))
        layout.write_text(json.dumps({"firsts": firsts, "finished": True}))
        outputs.remove_tree(staged)
        failpoint("staged-removed", self.label())
        for j in range(len(firsts)):
            outputs.remove_tree(work / f"experts-{j}.zarr")
            (work / f"experts-{j}.done").unlink(missing_ok=True)
        return stats


def _trim(chunk, live: int, ctx: int):
    """A chunk's arrays (boundaries, ids: [sequences, ctx, ...]), alone or in tuples and lists,
    cut to their first `live` positions."""
    if isinstance(chunk, (tuple, list)):
        return type(chunk)(_trim(c, live, ctx) for c in chunk)
    if chunk is not None and chunk.ndim >= 2 and chunk.shape[1] == ctx:
        return chunk[:, :live]
    return chunk


def compute_dtype_name(choice: str, device: str) -> str:
    """--compute-dtype auto is float32 on the CPU (exact) and bfloat16 on CUDA, float16 on a GPU
    without bfloat16 (a value out of its range stops the pass: NaN or inf is never a result)."""
    if choice != "auto":
        return choice
    if device == "cpu":
        return "float32"
    return "bfloat16" if cuda_probe.cuda_facts()["bf16"] else "float16"


