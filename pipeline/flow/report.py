"""The result of a run: a dict with the documented keys, a table on the terminal."""

from ..model.arch import load_architecture
from ..run.modes import CHOICE_METHODS
from ..run.placement import Window, describe
from ..store import outputs


def build_result(spec, windows, scores: list, scored: dict, chain, numerics: dict) -> dict:
    """scores: the Score task of each shard; scored: their figures combined (tasks.score_result)."""
    own = [t for t in chain if t.model == scores[0].model]   # without the KL base's own chain
    tokenize = next(outputs.read_manifest(t.out_dir()) for t in own if t.task_family == "Tokenize")
    elapsed = sum(outputs.read_manifest(t.out_dir())["elapsed_s"] for t in own)   # a KL base's chain is its own
    # the work done: the corpus's sequences' positions, or a choice task's sequences' tokens, each sequence
    # whole (packed rows compute the tokens shared once: see the result's `positions`)
    evaluated = tokenize["n_tokens"] if spec.method.name in CHOICE_METHODS else tokenize["n_windows"] * spec.method.ctx
    hp = load_architecture(spec.gguf).hp
    layer_windows = [(t, outputs.read_manifest(t.out_dir())) for t in own if t.task_family == "LayerWindow"]
    # where each window was computed, as its output records it (the first shard's)
    done = {}
    for t, manifest in layer_windows:
        done.setdefault((t.first, t.last), (manifest.get("device", "cpu"), manifest.get("expert_slices", 1)))
    computed = []
    for w in windows:
        device, slices = done.get((w.first, w.last), (w.device, w.expert_slices))
        computed.append(Window(device, w.first, w.last, slices))
    largest, manifest = max(layer_windows, key=lambda tm: tm[1].get("weight_bytes", 0))
    return {
        **{k: v for k, v in scored.items() if k != "kld"}, "chunks": tokenize["n_windows"],
        "chunks_available": tokenize["available_windows"], "ctx": spec.method.ctx,
        "method": spec.method.name, "method_options": spec.method.as_dict(),
        "placement": [{"device": w.device, "first": w.first, "last": w.last, "expert_slices": w.expert_slices}
                      for w in computed],
        "placement_text": describe(computed),
        "largest_window": {"first": largest.first, "last": largest.last,
                           "weight_bytes": manifest.get("weight_bytes", 0)},
        "model": {"path": str(spec.model_path), "parts": [str(p) for p in spec.gguf.parts], "id": spec.model_id,
                  "content_sha256": outputs.read_manifest(scores[0].out_dir())["content_sha256"],
                  "architecture": spec.gguf.architecture, "n_layers": hp.n_layers},
        "corpus": {**spec.corpus_id, "tokens": tokenize["n_tokens"]},
        "task": spec.eval_task.name, **numerics,
        "elapsed_s": elapsed, "tokens_per_s": evaluated / elapsed if elapsed > 0 else None,
        "outputs": {_output_name(t): str(t.out_dir()) for t in own},
        **({"kld": {"base": scores[0].kl_base, **_base_dtype(scores[0]), **scored["kld"]}} if "kld" in scored else {}),
    }


def _base_dtype(score) -> dict:
    """The compute dtype of a KL base's chain (none for llama.cpp's base file)."""
    return {"base_dtype": score.base_task().dtype_name(score.device())} if score.base_is_model() else {}


def _output_name(task) -> str:
    name = task.task_family + (f"[{task.first}..{task.last})" if task.task_family == "LayerWindow" else "")
    return name + (f" shard {task.shard}" if getattr(task, "shards", 1) > 1 else "")


def print_report(r: dict, mode, per_window: bool = False) -> None:
    lw = r["largest_window"]
    rows = mode.report_rows(r) + [
        ("Model", f"{r['model']['path']} ({r['model']['architecture']}, {r['model']['n_layers']} layers"
                  + (f", {len(r['model']['parts'])} parts)" if len(r["model"].get("parts", [])) > 1 else ")")),
        ("Corpus", f"{r['corpus'].get('source', r['corpus'].get('tokens_file'))} ({r['corpus']['tokens']:,} tokens)"),
        ("Elapsed", f"{r['elapsed_s']:.1f} s"),
        ("Tokens/s", f"{r['tokens_per_s']:,.1f}" if r["tokens_per_s"] else "-"),
        ("Numerics", f"{r['compute_dtype']} compute, {r['boundary_dtype']} boundaries"
                     + (", llama.cpp's CPU arithmetic" if r.get("numerics") == "llama-cpp" else "")),
        ("Layer placement", r["placement_text"]),
        ("Largest window", f"layers [{lw['first']}..{lw['last']}): {lw['weight_bytes'] / 2**20:,.1f} MiB of weights"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    mode.print_details(r, per_window)
