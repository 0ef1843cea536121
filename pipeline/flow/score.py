"""Score: output norm + LM head over the last boundary, per-token figures of each scored target.
"""
from pathlib import Path

import luigi
import numpy as np
from gguf import Keys

from .. import numerics
from ..run.placement import (
    parse_placement,
    resolve_device,
)
from ..store.timing import device_peaks_mb, reset_device_peak
from .trunk import LayerWindow, PlacedTask, Tokenize

LOGITS_FILE = "logits.kld"     # --kl-base-out's rows, in the layout of llama.cpp's base file


class Score(PlacedTask):
    """Output norm + LM head over the last boundary: NLL per scored token, and with a KL base
    the per-token KL-divergence figures against the base's last boundary (kld.py)."""
    kl_base = luigi.Parameter(default="", description="base model of the KL-divergence, or llama.cpp's base file "
                                                      "(set by PerplexityRun)")
    base_placement = luigi.Parameter(default="", description="the base model's layer windows")
    base_dtype = luigi.Parameter(default="", description="the base model's compute dtype (default: the model's)")
    logits_out = luigi.BoolParameter(default=False, description="also keep each scored distribution as "
                                                                "llama.cpp's base file holds it")

    def requires(self):
        return [self.source_task()] + ([self.base_task()] if self.base_is_model() else [])

    def base_is_model(self) -> bool:
        """A KL base computed by its own chain (not a llama.cpp base file)."""
        from ..run.logits_file import is_logits_file

        return bool(self.kl_base) and not is_logits_file(self.kl_base)

    def source_task(self):
        return self.boundary_task(self.windows()[-1].last)

    def base_task(self):
        """The base model's last window, whose boundary stays for every run compared with it."""
        last = parse_placement(self.base_placement)[-1]
        return self.clone(LayerWindow, model=self.kl_base, placement=self.base_placement,
                          compute_dtype=self.base_dtype or self.compute_dtype, first=last.first, last=last.last)

    def device(self) -> str:
        return self.windows()[-1].device

    def identity(self):
        identity = {"model": self.spec().model_id, "compute_dtype": self.dtype_name(self.device()),
                    **self.shard_identity(), **self.device_identity(), **self.numerics_identity(),
                    **self.mode_identity(), "scoring": numerics.SCORING}
        if self.base_is_model():
            identity["kl_base"] = self.base_task().spec().model_id
        elif self.kl_base:
            from ..gguf_io.registry import file_sha256

            identity["kl_base_file"] = file_sha256(Path(self.kl_base))
        return identity | ({"logits_out": LOGITS_FILE} if self.logits_out else {})

    def weight_tensors(self) -> list[str]:
        return list(self.spec().gguf.tensors)   # every tensor: its content_sha256 is the model's

    def weight_contents(self) -> dict:
        if not self.base_is_model():
            return super().weight_contents()
        base = self.base_task().weight_contents()["content_sha256"]
        return super().weight_contents() | {"kl_base_content_sha256": base}

    def model_files(self) -> list:
        return super().model_files() + (self.base_task().model_files() if self.base_is_model() else [])

    def execute(self):
        import torch

        from ..model.arch import load_architecture
        from ..model.scoring import predicting, sequence_codes, target_scores
        from ..run.logits_file import LogitsHeader, chunk_rows, start_file, write_rows
        from ..run.modes.figures import FIELDS
        from ..store.arrays import load_tokens

        device = resolve_device(self.device())
        self.hold_to_budget(device)
        reset_device_peak(device)
        dtype = getattr(torch, self.dtype_name(device))
        # each head in its chain's compute dtype: the model's, and the KL base's
        dtypes = [dtype] + ([getattr(torch, self.base_task().dtype_name(device))] if self.base_is_model() else [])
        work = self.begin()
        plan, _ = self.plan()
        sources = [self.input_boundary()] + ([self.input_boundary(self.base_task())] if self.base_is_model() else [])
        n, ctx, _ = sources[0].array.shape
        offset = self.shard_sequences(plan.n_sequences).start
        fields = FIELDS if self.kl_base else ("nll",)
        base_file = "" if self.base_is_model() else self.kl_base          # llama.cpp's base file, if that
        vocab = self.spec().gguf.metadata[Keys.Tokenizer.LIST].count
        header = LogitsHeader(ctx, vocab, plan.n_sequences)   # --kl-base-out's file, laid out whole
        if self.logits_out:
            tokens = load_tokens(self.clone(Tokenize).out_dir() / "tokens.zarr")[:header.n_chunk * ctx]
            start_file(work / LOGITS_FILE, header, tokens)

        def load():
            ggufs = [self.spec().gguf] + ([self.base_task().spec().gguf] if self.base_is_model() else [])
            heads = [load_architecture(g).load_head(device, d) for g, d in zip(ggufs, dtypes)]

            def compute(i, hidden):
                # [sequences in chunk, ctx, fields] float64: figures at scored target positions, NaN elsewhere
                hidden = [torch.from_numpy(h) for h in hidden]
                out = np.full((hidden[0].shape[0], ctx, len(fields)), np.nan)
                first = offset + sources[0].sequences(i).start
                # the chunk's spans (a choice with nothing to score, Winogrande's identical options, has none)
                spans = [span for span in plan.spans_of(range(first, first + hidden[0].shape[0]))
                         if span[2] < span[3]]
                if not spans:
                    return out
                states = [torch.cat([predicting(h[row - first], lo, hi, src) for _, row, lo, hi, src in spans])
                          for h in hidden]                                           # [targets, hidden] each
                targets = np.concatenate([plan.ids[row, lo:hi] for _, row, lo, hi, _ in spans])
                base_rows = np.concatenate([chunk_rows(base_file, s) for s, *_ in spans]) if base_file else None
                figures = target_scores(heads, states, targets, device, dtypes, base_rows)
                self.require_finite(i, figures)
                at = 0
                for s, row, lo, hi, _ in spans:
                    out[row - first, lo:hi], at = figures[at:at + hi - lo], at + hi - lo
                    if self.logits_out:   # the chunk's rows are on disk before its scores: a resume finds both
                        codes = sequence_codes(heads[0], hidden[0][row - first], lo, hi, header.row_width, vocab,
                                               device, dtype)
                        write_rows(work / LOGITS_FILE, header, s, codes)
                return out
            return compute

        stats = self.fill(work / "tokens.zarr", (n, ctx, len(fields)), "float64",
                          lambda i: [s.read_chunk(i) for s in sources], load, finite=False)  # NaN: not scored
        self.commit(device=device, fields=list(fields), **device_peaks_mb(device), **stats)

    def scored(self) -> list[tuple[int, np.ndarray]]:
        """The completed output: (span, [scored tokens, fields]) of each span (a sequence) in the
        shard's rows."""
        plan, _ = self.plan()
        mine = self.shard_sequences(plan.n_sequences)
        rows = _read_all(self.out_dir() / "tokens.zarr")
        return [(s, rows[row - mine.start, lo:hi]) for s, row, lo, hi, _ in plan.spans_of(mine)]


def score_result(scores: list) -> dict:
    """The run's mode's figures (PPL, KLD, accuracy) over the shards' Score outputs, in plan order
    (a packed plan's spans may lie in any row)."""
    scored = [rows for _, rows in sorted((pair for s in scores for pair in s.scored()), key=lambda pair: pair[0])]
    return run_mode(scores).reduce(scored, scores[0].plan()[1])


def run_mode(scores: list):
    from ..run.modes import mode_of

    return mode_of(scores[0].spec().method.name, bool(scores[0].kl_base), scores[0].numerics)


def _read_all(path: Path) -> np.ndarray:
    from ..store.arrays import ChunkedArray

    store = ChunkedArray.open(path)
    return np.concatenate([store.read_chunk(i) for i in range(store.n_chunks)])


