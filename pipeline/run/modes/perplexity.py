"""Perplexity over a corpus cut into sequences (run/corpus_plan.py), and KL-divergence against a
base model's distributions over the same sequences."""
import functools
import os

import numpy as np
from gguf import Keys

from ...errors import UserError
from .base import Mode, ModePlan
from .figures import kld_figures, perplexity_figures


class Perplexity(Mode):
    name = "perplexity"

    def plan(self, spec) -> ModePlan:
        from ..corpus_plan import plan_sequences
        from ..evaltask import corpus_text, llama_prompt
        from ..tokens_file import read_tokens_file

        if spec.tokens_file:
            tokens = read_tokens_file(spec.tokens_file)
            vocab = spec.gguf.metadata[Keys.Tokenizer.LIST].count
            if tokens.size and not 0 <= int(tokens.min()) <= int(tokens.max()) < vocab:
                raise UserError(f"token ids range over [{tokens.min()}, {tokens.max()}], outside the vocabulary "
                                f"of {vocab}")
        else:
            text, _ = corpus_text(spec.eval_task, spec.corpus)
            if spec.method.name == "llama-cpp":     # read as llama-perplexity reads -f; stride: as it is
                text = llama_prompt(text, spec.escape)
            stat = os.stat(spec.model_path)
            tokens = encoded(str(spec.model_path), (stat.st_size, stat.st_mtime_ns), text, spec.method.bos)
        from ..logits_file import is_logits_file

        whole = bool(spec.tokens_file) and is_logits_file(spec.tokens_file)
        return ModePlan(tokens, plan_sequences(tokens, spec.method, spec.bos_id, whole_sequences=whole), {})

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        return perplexity_figures([rows[:, 0] for rows in scored])

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        return [
            ("PPL", f"{r['ppl']:.4f} +/- {r['ppl_stderr']:.5f}"),
            ("Mean NLL", f"{r['mean_nll']:.6f}"),
            ("Tokens scored", f"{r['tokens_scored']:,}"),
            ("Chunks", f"{r['chunks']} of {r['chunks_available']}"),
            ("Context", str(r["ctx"])),
            ("Method", r["method"]),
        ]

    def print_details(self, r: dict, per_sequence: bool) -> None:
        if per_sequence:
            print(f"\n{'sequence':>8}  {'tokens':>6}  {'mean NLL':>9}  {'running PPL':>11}")
            for w in r["per_window"]:
                print(f"{w['window']:>8}  {w['tokens']:>6}  {w['mean_nll']:>9.4f}  {w['running_ppl']:>11.4f}")
        if r["chunks"] < r["chunks_available"]:
            print(f"\nScored {r['chunks']} of the corpus's {r['chunks_available']} sequences: "
                  f"add --chunks 0 to score the whole corpus.")


class KLDivergence(Perplexity):
    """Perplexity's plan; each scored target also compared with the base model's distribution."""
    name = "kl-divergence"

    def reduce(self, scored: list[np.ndarray], attrs: dict) -> dict:
        return super().reduce(scored, attrs) | {"kld": kld_figures(np.concatenate(scored))}

    def report_rows(self, r: dict) -> list[tuple[str, str]]:
        k = r["kld"]
        return super().report_rows(r) + [
            ("KL base", k["base"] + (f" ({k['base_dtype']} compute)" if "base_dtype" in k else "")),
            ("Mean KLD", f"{k['mean']:.6f} +/- {k['stderr']:.6f}"),
            ("KLD median / p90 / p99", f"{k['median']:.6f} / {k['p90']:.6f} / {k['p99']:.6f}"),
            ("KLD min / max", f"{k['min']:.6f} / {k['max']:.6f}"),
            ("Same top token", f"{100 * k['same_top']:.3f}%"),
            ("RMS delta p", f"{100 * k['delta_p_rms']:.3f}%"),
            ("PPL(Q) / PPL(base)", f"{k['ppl_ratio']:.6f} (base PPL {k['ppl_base']:.4f})"),
            ("Log-prob correlation", f"{100 * k['logprob_correlation']:.3f}%"),
        ]


@functools.lru_cache(maxsize=4)
def encoded(model_path: str, stamp: tuple[int, int], text: str, add_bos: bool | None) -> np.ndarray:
    """`text`'s ids by the tokenizer of the model file as it is (`stamp`: its size and change
    time), kept for the process: a run plans its sequences while Luigi schedules it and again in
    its Tokenize task, and a sweep plans each point over the same corpus. Read-only: int32 [tokens]."""
    from ...gguf_io.reader import open_gguf
    from ...gguf_io.tokenizer import load_tokenizer

    tokens = np.array(load_tokenizer(open_gguf(model_path)).encode(text, add_bos=add_bos), dtype=np.int32)
    tokens.flags.writeable = False
    return tokens
