"""The entry tasks: PerplexityRun (places the layers, runs the chain, reports) and Sweep (a grid
of runs). They compute no output folder of their own: they always report, from the cached chain.
"""
import hashlib
import json
import logging
import socket
from pathlib import Path

import luigi
from gguf import Keys

from ..errors import UserError
from ..numerics import set_numerics
from ..paths import RUNS, is_local, location
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
from . import console
from .output_task import SPEC_PARAMS, RunTask, chain_failure, under_root
from .score import Score, run_mode, score_result
from .trunk import Tokenize, compute_dtype_name

log = logging.getLogger("layercycle")


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
    numerics = luigi.ChoiceParameter(choices=["exact", "llama-cpp"], default="exact",
                                     description="exact: the model's math on its dequantized weights; llama-cpp: "
                                                 "llama-perplexity's CPU arithmetic (8-bit activations, float16 KV)")
    per_window = luigi.BoolParameter(default=False, description="print each sequence's mean NLL and the running PPL")
    result_json = luigi.Parameter(default="", significant=False, description="write the result as JSON here")
    dump_tokens = luigi.Parameter(default="", significant=False,
                                  description="write the corpus's token ids as the run tokenized them here "
                                              "(.npy, or whitespace-separated ids: what --tokens-file reads)")
    kl_base = luigi.Parameter(default="", description="KL-divergence against this base model (alias, GGUF path, "
                                                      "the result JSON of its run, or llama.cpp's base file)")
    kl_base_dtype = luigi.ChoiceParameter(choices=["", "auto", "float32", "bfloat16", "float16"], default="",
                                          description="compute dtype of the KL base's chain (default: --compute-dtype)")
    kl_base_out = luigi.Parameter(default="", significant=False,
                                  description="write the run's distributions as llama.cpp's KL-divergence base file")
    shards = luigi.IntParameter(default=1, description="split the corpus into this many independent chains "
                                                       "(each reads every layer's weights once)")

    def placement(self, check_memory: bool = True, kl_base=None) -> list:
        """The layer windows; before a pass (not when reporting one) checked against memory, with
        the KL base's head (`kl_base`: its PerplexityRun) beside the model's in the Score task. Auto-sized windows
        depend on the model, the settings and the devices' budgets only (preflight.device_budget),
        so a rerun finds the windows of the run it resumes."""
        from ..model.arch import load_architecture
        from ..run import preflight

        s = self.spec()
        hp = load_architecture(s.gguf).hp
        device = resolve_device(self.device)
        caps = {device: preflight.parse_size(self.device_memory)} if self.device_memory else {}
        dtypes = {d: compute_dtype_name(self.compute_dtype, d) for d in {device, "cpu"}}
        ends_on_cpu = self.gpu_layers >= 0 and self.first_layer + self.gpu_layers < hp.n_layers

        def pack(dev: str, first: int, last: int) -> list:
            import torch

            dtype = getattr(torch, dtypes[dev])
            per_layer, experts = preflight.layer_costs(s.gguf, hp.n_layers, dtype, range(first, last))
            what = "--device-memory" if dev in caps else f"the {dev} budget ({preflight.AUTO_SHARE[dev]:.0%} of it)"
            score_here = dev == ("cpu" if ends_on_cpu else device)   # the Score task runs on the last window's device
            floor = preflight.heads_need(self.score_heads(dev, kl_base))[0] if score_here else 0
            fixed = preflight.window_fixed_bytes(s.gguf, self.sequences_per_chunk, s.method.ctx, hp.n_head, dev)
            return pack_windows(per_layer, fixed, preflight.device_budget(dev, caps.get(dev)), first, last, dev,
                                what, experts, floor)

        windows = plan_placement(hp.n_layers, parse_window_layers(self.window_layers), self.gpu_layers,
                                 self.first_layer, device, pack, self.cycle)
        if self.window_layers == "auto" and not self.device_memory:
            with outputs.disk_errors(self.run_root):
                windows = self.recorded_placement(windows, device, dtypes)
        check_tiling(windows, hp.n_layers)
        if check_memory:
            preflight.check_memory(s.gguf, windows, hp.n_layers, hp.n_head, self.sequences_per_chunk, s.method.ctx,
                                   {w.device: dtypes[w.device] for w in windows},
                                   heads=self.score_heads(windows[-1].device, kl_base), caps=caps)
        return windows

    def score_heads(self, device: str, kl_base=None) -> list:
        """(GGUFIndex, compute dtype name) of each LM head the Score task holds on `device`: the
        model's, and its KL base's (`kl_base`: the base's PerplexityRun) in the base's dtype."""
        runs = [self] + ([kl_base] if kl_base is not None else [])
        return [(run.spec().gguf, compute_dtype_name(run.compute_dtype, device)) for run in runs]

    def base_run(self):
        """The KL base's own run (None: no base, or llama.cpp's base file), in the base's compute
        dtype: by default the model's."""
        if self.file_base() or not self.kl_base:
            return None
        return self.clone(PerplexityRun, model=self.base_model(), kl_base="",
                          compute_dtype=self.kl_base_dtype or self.compute_dtype)

    def recorded_placement(self, windows: list, device: str, dtypes: dict) -> list:
        """Auto windows sized from this host's memory, unless the run root records the windows
        a first planner chose for the same model and settings: then those, so that workers on
        hosts with other memory plan the same windows and share every output."""
        s = self.spec()
        # --sequences-per-chunk under its former name, so that records written before the rename hold
        key = {"model": s.model_id, "device": device, "dtypes": dtypes, "gpu_layers": self.gpu_layers,
               "first_layer": self.first_layer, "ctx": s.method.ctx, "windows_per_chunk": self.sequences_per_chunk,
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

    def spec(self):
        return resolve_run(*({p: getattr(self, p) for p in SPEC_PARAMS} | self.file_base()).values())

    def file_base(self) -> dict:
        """--kl-base as llama.cpp's base file: the run's parameters that make it score the tokens,
        ctx and chunks the file was computed over (llama-perplexity --kl-divergence's rules)."""
        from ..run.logits_file import is_logits_file, read_header

        if not is_logits_file(self.kl_base):
            return {}
        h = read_header(self.kl_base)
        given = [f"--{name.replace('_', '-')}" for name in ("corpus", "tokens_file", "hellaswag", "winogrande",
                                                                "multiple_choice")
                 if getattr(self, name)]
        given += ["--ctx"] if self.ctx not in (0, h.n_ctx) else []
        given += ["--method"] if self.method not in ("", "llama-cpp") else []
        given += ["--unscored-prefix"] if self.unscored_prefix >= 0 else []
        if given:
            raise UserError(f"--kl-base {self.kl_base} is llama.cpp's base file: it sets the tokens, ctx {h.n_ctx} "
                            f"and method it was computed with, so {', '.join(given)} does not apply")
        return {"tokens_file": str(Path(self.kl_base).resolve()), "method": "llama-cpp", "ctx": h.n_ctx,
                "chunks": max(self.chunks, 0)}

    def check_kl_options(self) -> None:
        """--kl-base and --kl-base-out where they apply: a corpus's distributions, llama.cpp's
        layout for a file written, a base file's vocabulary the model's."""
        from ..run.logits_file import read_header

        method = self.spec().method
        if (self.kl_base or self.kl_base_out) and method.name not in ("llama-cpp", "stride"):
            raise UserError(f"--kl-base and --kl-base-out compare distributions over a corpus; the {method.name} "
                            f"method scores choices")
        if self.kl_base_out and (method.name, method.effective_prefix) != ("llama-cpp", method.ctx // 2):
            raise UserError("--kl-base-out writes llama.cpp's layout: the llama-cpp method, its first half of "
                            "each sequence unscored")
        if self.kl_base_out and not is_local(location(self.run_root)):
            raise UserError(f"--kl-base-out writes its file's rows in place beside the Score output: give a local "
                            f"--run-root, not {self.run_root}")
        vocab = self.spec().gguf.metadata[Keys.Tokenizer.LIST].count
        if self.file_base() and (held := read_header(self.kl_base).n_vocab) != vocab:
            raise UserError(f"--kl-base {self.kl_base} holds distributions over {held} tokens, the model's "
                            f"vocabulary has {vocab}")

    def check_base_vocabulary(self, base) -> None:
        """KL-divergence compares distributions over one vocabulary: a base model's tokenizer is the
        model's (over a text), or at least its tokens are (over --tokens-file ids)."""
        mine = self.spec()
        sizes = [s.gguf.metadata[Keys.Tokenizer.LIST].count for s in (base, mine)]
        if sizes[0] != sizes[1]:
            raise UserError(f"--kl-base {self.kl_base}: its vocabulary has {sizes[0]:,} tokens, the model's "
                            f"{sizes[1]:,}; KL-divergence compares distributions over the same vocabulary")
        if base.tokenizer_id != mine.tokenizer_id or (base.gguf.fingerprint(Keys.Tokenizer.LIST)
                                                      != mine.gguf.fingerprint(Keys.Tokenizer.LIST)):
            what = "tokens" if self.tokens_file else "tokenizer"
            raise UserError(f"--kl-base {self.kl_base}: its {what} differ{'' if self.tokens_file else 's'} from "
                            f"the model's; KL-divergence compares distributions over the same vocabulary")

    def planned_sequences(self) -> int:
        """The sequences the run scores: its Tokenize output's count, or the mode's plan."""
        if "_planned" not in self.__dict__:
            tokenize = self.clone(Tokenize, **self.file_base())
            if tokenize.complete():
                self._planned = outputs.read_manifest(tokenize.out_dir())["n_windows"]
            else:
                from ..run.modes import mode_of

                self._planned = mode_of(self.spec().method.name).plan(self.spec()).sequences.n_sequences
        return self._planned

    def check_score_disk(self) -> None:
        """The Score outputs' figures (float64 per position and field: 1, or 5 against a KL base)
        and, for --kl-base-out, the file they hold laid out whole, against the free disk, before any
        work (the boundaries are counted by the Embed task). FILE is that file linked, no second
        copy, where it is on the run root's disk and the run has one shard; else a copy, counted on
        the disk it goes to."""
        from ..run.logits_file import LogitsHeader
        from ..run.modes.figures import FIELDS
        from ..run.preflight import GiB

        s = self.spec()
        n = self.planned_sequences()
        need = 8 * n * s.method.ctx * (len(FIELDS) if self.kl_base else 1)
        file_bytes = LogitsHeader(s.method.ctx, s.gguf.metadata[Keys.Tokenizer.LIST].count, n).size()
        free = outputs.free_bytes(location(self.run_root))
        if self.kl_base_out:
            need += file_bytes
            target = outputs.free_bytes(location(self.kl_base_out).parent)
            if outputs.same_disk(location(self.run_root), location(self.kl_base_out)):
                need += file_bytes if self.shards > 1 else 0
            elif target is not None and file_bytes > target:
                raise UserError(f"--kl-base-out {self.kl_base_out} needs {file_bytes / GiB:.2f} GiB but "
                                f"{target / GiB:.2f} GiB are free there")
        if free is not None and need > free:
            what = "scores and --kl-base-out's file" if self.kl_base_out else "scores"
            raise UserError(f"the run's {what} need about {need / GiB:.2f} GiB under {self.run_root} but "
                            f"{free / GiB:.2f} GiB are free")

    def apply_numerics(self) -> None:
        """The run's numerics set for this process, so that the preflight counts what they compute;
        llama-cpp numerics for a family emulated in them, computed in float32 as llama.cpp's CPU
        path computes (the model's and its KL base's)."""
        if self.numerics == "exact":
            set_numerics("exact", "")
            return
        set_numerics(self.numerics, self.spec().gguf.architecture)
        device = resolve_device(self.device)
        for dtype in {self.compute_dtype, self.kl_base_dtype or self.compute_dtype}:
            if compute_dtype_name(dtype, device) != "float32":
                raise UserError(f"--numerics llama-cpp computes in float32, as llama.cpp's CPU path does; "
                                f"--compute-dtype {dtype} is {compute_dtype_name(dtype, device)} on {device}: "
                                f"give --compute-dtype float32")

    def check_shards(self) -> None:
        """A shard takes whole Zarr chunks of sequences: at most as many shards as chunks."""
        if self.shards < 1:
            raise UserError(f"--shards must be >= 1, got {self.shards}")
        if self.shards == 1:
            return
        n = self.planned_sequences()
        chunks = -(-n // self.sequences_per_chunk)
        if self.shards > chunks:
            raise UserError(f"--shards {self.shards}: the corpus gives {n} sequences, {chunks} Zarr chunk"
                            f"{'s' * (chunks != 1)} of --sequences-per-chunk {self.sequences_per_chunk}, and a "
                            f"shard takes whole chunks: give at most --shards {chunks} (or a smaller "
                            f"--sequences-per-chunk)")

    def score_tasks(self, check_memory: bool = True) -> list:
        """The Score task of each shard (one unless --shards)."""
        self.check_renamed()
        self.apply_numerics()
        self.check_shards()
        self.check_kl_options()
        file_base = self.file_base()
        base = self.base_run()
        if base is not None:
            self.check_base_vocabulary(base.spec())
        if check_memory:
            self.check_score_disk()
        params = {"placement": format_placement(self.placement(check_memory, base)),
                  "logits_out": bool(self.kl_base_out), **file_base}
        if base is not None:
            params |= {"kl_base": base.model, "base_placement": format_placement(base.placement(check_memory)),
                       "base_dtype": base.compute_dtype}
        if file_base:
            params["kl_base"] = file_base["tokens_file"]
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
        """The result of the completed chain (README: "Outputs", the JSON keys)."""
        from .report import build_result

        scores = self.score_tasks(check_memory=False)
        windows = scores[0].windows()
        chain = _chain(scores)
        dtypes = sorted({scores[0].dtype_name(w.device) for w in windows})
        numerics = {"compute_dtype": "/".join(dtypes), "boundary_dtype": self.boundary_dtype, "shards": self.shards,
                    "numerics": self.numerics}
        return build_result(self.spec(), windows, scores, score_result(scores), chain, numerics)

    def run(self):
        from .report import print_report

        scores = self.score_tasks(check_memory=False)
        if not all(t.complete() for t in scores):
            self.score_tasks()  # requires() found no chain to run: say why (the memory preflight) ...
            if failed := run_failure(scores):
                raise UserError(failed)   # ... else a task of the chain failed while it ran: why
        result = self.result()
        print_report(result, run_mode(self.score_tasks(check_memory=False)), per_window=self.per_window)
        if self.result_json:
            path = location(self.result_json)
            path.parent.mkdir(parents=True, exist_ok=True)
            outputs.write_json(path, result)
        if self.kl_base_out:
            self.write_base_file(self.score_tasks(check_memory=False), result)
        if self.dump_tokens:
            from ..run.tokens_file import write_tokens_file
            from ..store.arrays import load_tokens

            write_tokens_file(self.dump_tokens, load_tokens(self.score_tasks(check_memory=False)[0].clone(Tokenize)
                                                            .out_dir() / "tokens.zarr"))

    def write_base_file(self, scores: list, result: dict) -> None:
        """--kl-base-out: llama.cpp's base file, which the Score outputs hold laid out whole (each
        its shard's rows): one Score's file linked to FILE, no second copy, where both are on one
        file system; else copied."""
        from ..run.logits_file import LogitsHeader, publish
        from .score import LOGITS_FILE

        s = self.spec()
        header = LogitsHeader(s.method.ctx, s.gguf.metadata[Keys.Tokenizer.LIST].count, result["chunks"])
        path = location(self.kl_base_out)
        path.parent.mkdir(parents=True, exist_ok=True)
        linked = publish(path, header, [(score.out_dir() / LOGITS_FILE, score.shard_sequences(header.n_chunk))
                                        for score in scores])
        how = "the Score output's file linked, no second copy" if linked else "copied from the Score outputs"
        print(f"\nKL-divergence base file: {path} ({header.size() / 2**20:,.1f} MiB, {header.n_chunk} chunks of "
              f"{header.n_ctx}, llama-perplexity --kl-divergence-base's layout; {how})")


def run_failure(scores: list) -> str | None:
    """Why a run's chain failed while it ran (its Scores end with the reason), or None."""
    failed = chain_failure(scores)
    return failed and failed[1]


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
    point that is refused, or fails while it runs, is a row with its reason, never the end of the
    sweep; the sweep then exits non-zero, naming those points, after every other point was
    computed."""
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
                for _, scores in self._points:   # every point is tried again: a failure is this attempt's
                    for score in [] if isinstance(scores, str) else scores:
                        outputs.remove_file(score.failure_path())
                record_runs(self.run_root, self.config, [
                    {"scores": [under_root(root, s) for s in scores],
                     "outputs": [under_root(root, t) for t in _chain(scores) if t.model == scores[0].model]}
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
        from .sweep import load_sweep, parse_point, point_row, table_row, write_plots, write_tables

        out = load_sweep(self.config)["out"]
        rows = []
        for params, scores in self.points():
            if isinstance(scores, str):
                rows.append(point_row(params, "refused", scores))
                continue
            if failed := run_failure(scores):
                rows.append(point_row(params, "failed", failed))
                continue
            if not all(s.complete() for s in scores):   # its failure record removed by a worker started later
                rows.append(point_row(params, "failed", "its run did not complete; run the sweep again"))
                continue
            result = PerplexityRun(run_root=self.run_root, **parse_point(PerplexityRun, params)).result()
            rows.append(table_row(result, open_gguf(result["model"]["path"])))
        write_tables(rows, out)
        plots = write_plots(rows, out)
        print("\n" + (out / "sweep.md").read_text())
        print(f"{len(rows)} runs: {', '.join(str(p) for p in [out / 'sweep.csv', out / 'sweep.md', *plots])}")
        missing = {status: [r["model"] for r in rows if r["status"] == status] for status in ("refused", "failed")}
        if any(missing.values()):
            said = "; ".join(f"{len(names)} {status} ({', '.join(names)})" for status, names in missing.items()
                             if names)
            raise UserError(f"{said} of the sweep's {len(rows)} runs; the table gives each reason, and a rerun "
                            f"computes what failed or is missing")


@Score.event_handler(luigi.Event.SUCCESS)
def _count_sweep_run(task) -> None:
    from .sweep import runs_done, sweeps_with

    for record in sweeps_with(task.run_root, under_root(location(task.run_root), task)):
        done = runs_done(task.run_root, record)
        log.info(f"Sweep: {sum(done)}/{len(done)} runs done")

