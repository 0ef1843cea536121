"""The conformance matrix every architecture joins, and ARCHITECTURES.md's table printed from it.

    python -m pipeline.tools.architectures        # the table, as ARCHITECTURES.md holds it

Each member is one tiny model of a family: a random Hugging Face model converted by llama.cpp's
own converter (tests/hf_models.py names it), or, for a family no converter takes, a file
pipeline/tools/synthetic.py writes. tests/test_conformance.py runs every cell of every member
through the Luigi tasks, and fails for an architecture of the registry that has no member:

- cycled: 1-layer windows give the whole trunk's NLL bit for bit;
- split: `--gpu-layers 2 --first-layer 1` (the CPU standing in for the device) likewise;
- sliced: each layer with routed experts run in expert slices gives the held layer's NLL bit
  for bit; a family that holds its experts whole (`sliceable_experts = False`) has the planner
  refuse a budget that would need slices, naming the smallest that works;
- shards: `--shards 2` gives the one chain's NLL; resume: a pass killed at a chunk (SIGKILL at a
  failpoint) and run again gives the uninterrupted one's;
- bfloat16: the mean NLL within the member's bound of float32 (twice what it measured, at least
  0.004 nats, on random ids of the tiny vocabulary);
- preflight: the memory the preflight counts for a batch is at least the measured peak of a
  real-width layer of each layer kind and at most twice it (tests/test_activation_memory.py);
- choice tasks: a task's sequences packed in one row (the tokens they share once, each
  sequence a branch that sees them and itself, several tasks in a row) give each sequence's
  scores in a row of its own within float reassociation (5e-4 nats; a recurrent layer scans each
  sequence's shared tokens once and each branch from the state they leave); a family whose
  attention selects keys by their place in the row (`packs_sequences = False`) has packed rows
  refused and its plans keep a row per sequence;
- llama-cpp numerics: the member in 8 bits gives llama-perplexity's NLL (within 1e-3) on at least
  10% of the tokens of 32 chunks, where exact numerics do not (tests/numerics_reference.py holds
  llama-perplexity's); an architecture not checked so is refused in that mode.
"""
import sys
from dataclasses import dataclass, field

from ..model.arch import ARCHITECTURES

MARKERS = ("<!-- conformance matrix: begin (python -m pipeline.tools.architectures prints it) -->",
           "<!-- conformance matrix: end -->")
# architectures whose preflight count is checked against a measured peak at real width
# (tests/test_activation_memory.py): the registered models' first layers, a synthetic model of each
# of the family's layer kinds at hidden 2048 (pipeline/tools/synthetic.py), or, for the others, their
# converted members at hidden 2048 (tests/hf_models.py's WIDE)
SYNTHETIC_WIDE = "synthetic, hidden 2048"
CONVERTED_WIDE = "converted, hidden 2048"
MEASURED_ON = {"llama": "SmolLM2-135M", "gemma3": "Gemma-3-270M", "qwen2": "Qwen2.5-0.5B",
               **{family: SYNTHETIC_WIDE for family in (
                   "qwen3moe", "nemotron_h_moe", "deepseek2", "deepseek32", "kimi-linear", "gemma4",
                   "minimax-m3", "gpt-oss", "llama4", "qwen3next", "qwen4exp", "deepseek4")}}
PREFLIGHT_MEASURED = {arch: MEASURED_ON.get(arch, CONVERTED_WIDE) for arch in ARCHITECTURES}

@dataclass(frozen=True)
class Member:
    name: str                   # the tiny model: tests/hf_models.py's SPECS key, or a synthetic name
    architecture: str           # its general.architecture
    experts: bool               # it has layers of routed experts (the test checks the file agrees)
    bfloat16_nats: float        # the bound on |mean NLL in bfloat16 - in float32|
    measured: float             # what it measured
    synthetic: dict = field(default_factory=dict)   # pipeline/tools/synthetic.py's Shape, where written so,
                                                    # its tokenizer_from naming a converted member
    note: str = ""
    ctx: int = 64               # the passes' context


def member(name, architecture, has_experts, bound, measured, note="", synthetic=None, ctx=64) -> Member:
    return Member(name, architecture, has_experts, bound, measured, synthetic or {}, note, ctx)


def sliced_windows(gguf, device: str) -> list:
    """The sliced cell's placement: every layer in a window of its own on `device`, each layer with
    routed experts in two expert slices."""
    from ..model.arch import load_architecture
    from ..model.arch.experts import expert_tensor_names
    from ..run.placement import Window

    return [Window(device, i, i + 1, 2 if expert_tensor_names(gguf, i) else 1)
            for i in range(load_architecture(gguf).hp.n_layers)]


# DeepSeek-V4: one layer of each attention kind and a second sparse one (a window of 16 keys; entries
# of 4 keys, the indexer's top 8; all entries of 128 keys), the first layer routed by the token's id
DEEPSEEK4 = dict(family="deepseek4", layers=4, hidden=128, heads=4, kv_heads=1, head_dim=64, rope_dim=16,
                 context=512, quant="F32", experts=8, experts_used=2, expert_ffn=64, shared_ffn=64, streams=4,
                 sliding_window=16, pattern="CHSC", q_lora_rank=64, index_heads=2, index_dim=64, index_top_k=8,
                 out_groups=2, out_rank=32, hash_layers=1, swiglu_limit=2.0, tokenizer_from="qwen3")

MATRIX: list[Member] = [
    member("mixtral", "llama", True, 0.03, 0.0145),
    member("qwen2", "qwen2", False, 0.013, 0.0064),
    member("qwen3", "qwen3", False, 0.004, 0.0010),
    member("qwen3moe", "qwen3moe", True, 0.007, 0.0031),
    member("qwen2moe", "qwen2moe", True, 0.021, 0.0104),
    member("qwen3vl", "qwen3vl", False, 0.01, 0.0048),
    member("qwen3vlmoe", "qwen3vlmoe", True, 0.015, 0.0071),
    member("qwen2vl", "qwen2vl", False, 0.004, 0.0014),
    member("qwen3next", "qwen3next", True, 0.004, 0.0008),
    member("qwen35", "qwen35", False, 0.025, 0.0123),
    member("qwen35moe", "qwen35moe", True, 0.004, 0.0007),
    member("qwen4exp", "qwen4exp", True, 0.09, 0.068, "each query keeps 11 of up to 150 keys, which inputs "
           "rounded to 16 bits move (0.011 with its attention dense)"),
    member("gemma2", "gemma2", False, 0.004, 0.0012),
    member("gemma3", "gemma3", False, 0.004, 0.0015),
    member("gemma4", "gemma4", False, 0.025, 0.0167),
    member("gemma4_moe", "gemma4", True, 0.013, 0.0088),
    member("nemotron_h", "nemotron_h", False, 0.005, 0.0020),
    member("nemotron_h_moe", "nemotron_h_moe", True, 0.004, 0.0012),
    member("deepseek2", "deepseek2", True, 0.055, 0.0110),
    member("deepseek2_lite", "deepseek2", True, 0.021, 0.0100),
    member("deepseek32", "deepseek32", True, 0.19, 0.0925, "its indexer runs in float32, but on inputs rounded "
           "to 16 bits its top 16 of each query's keys moves where scores lie close"),
    # its heavily compressed layer needs 128 keys before its first entry
    member("deepseek4", "deepseek4", True, 0.007, 0.0032, synthetic=DEEPSEEK4, ctx=256),
    member("glm-dsa", "glm-dsa", True, 0.04, 0.0198, "deepseek32's indexer: its top 16 moves with inputs "
           "rounded to 16 bits"),
    member("glm4moe", "glm4moe", True, 0.037, 0.0181),
    member("glm4", "glm4", False, 0.004, 0.0011),
    member("mistral3", "mistral3", False, 0.009, 0.0044),
    member("mistral4", "mistral4", True, 0.04, 0.0164, "its YaRN mscale 1 as published"),
    member("gpt-oss", "gpt-oss", True, 0.09, 0.0442),
    member("minimax-m2", "minimax-m2", True, 0.023, 0.0111),
    member("minimax-m3", "minimax-m3", True, 0.004, 0.0005, "its indexer in float32"),
    member("llama4", "llama4", True, 0.004, 0.0011),
    member("ernie4_5-moe", "ernie4_5-moe", True, 0.021, 0.0102),
    member("exaone4", "exaone4", False, 0.004, 0.0009),
    member("smollm3", "smollm3", False, 0.018, 0.0087),
    member("olmo2", "olmo2", False, 0.004, 0.0001),
    member("olmo3", "olmo2", False, 0.005, 0.0021),
    member("olmoe", "olmoe", True, 0.038, 0.0187),
    member("seed_oss", "seed_oss", False, 0.013, 0.0064),
    member("granite", "granite", False, 0.006, 0.0027),
    member("granitemoe", "granitemoe", True, 0.004, 0.0017),
    member("granitehybrid", "granitehybrid", True, 0.026, 0.0126),
    member("phi3", "phi3", False, 0.015, 0.0074),
    member("phi3_longrope", "phi3", False, 0.006, 0.0029),
    member("command-r", "command-r", False, 0.012, 0.0058),
    member("cohere2", "cohere2", False, 0.018, 0.0089),
    member("cohere2moe", "cohere2moe", True, 0.04, 0.0264),
    member("lfm2", "lfm2", False, 0.004, 0.0009),
    member("lfm2moe", "lfm2moe", True, 0.004, 0.0002),
    member("falcon-h1", "falcon-h1", False, 0.005, 0.0023),
    member("afmoe", "afmoe", True, 0.004, 0.0004),
    member("bailingmoe2", "bailingmoe2", True, 0.004, 0.0001),
    member("mimo2", "mimo2", True, 0.06, 0.0296),
    member("kimi-linear", "kimi-linear", True, 0.012, 0.0056),
    member("kimi-k3", "kimi-k3", True, 0.004, 0.0014),
    member("step35", "step35", True, 0.009, 0.0058),
    member("bailingmoe3", "bailingmoe3", True, 0.0064, 0.0032),
    member("dots1", "dots1", True, 0.004, 0.0005),
    member("dots3note", "dots3note", True, 0.05, 0.0252, "deepseek32's indexer on its full layers: its top 16 "
           "moves with inputs rounded to 16 bits"),
    member("apertus", "apertus", False, 0.004, 0.0013),
    member("hunyuan-moe", "hunyuan-moe", True, 0.004, 0.0001),
    member("hy_v3", "hy_v3", True, 0.032, 0.0160),
    member("hy_v4", "hy_v4", True, 0.05, 0.0247, "deepseek32's indexer: its top 16 moves with inputs "
           "rounded to 16 bits"),
    member("deci", "deci", False, 0.004, 0.0009),
    member("laguna", "laguna", True, 0.012, 0.0060),
    member("grok", "grok", True, 0.025, 0.0122),
    member("grok2", "grok", True, 0.011, 0.0054),
    member("mamba", "mamba", False, 0.0092, 0.0046),
    member("jamba", "jamba", True, 0.04, 0.0198),
    member("minimax-01", "minimax-01", True, 0.033, 0.0163, "0.0078 on another AMD EPYC: torch's bfloat16 products "
           "round otherwise by CPU"),
    member("exaone-moe", "exaone-moe", True, 0.039, 0.0196),
    member("muse-glimmer", "muse-glimmer", False, 0.042, 0.0207),
    member("glm5next", "glm5-next", True, 0.048, 0.0238, "its random layers amplify rounding: 0.4% on layer 1's "
           "input leaves 4.7% at the trunk's end in float32"),
]


def table() -> list[str]:
    """ARCHITECTURES.md's matrix: a row per architecture of the registry, a column per cell."""
    from ..numerics import NOT_EMULATED

    lines = ["| architecture | family | tiny models | cycled | split | sliced | shards, resume | "
             "bfloat16 (nats: bound / measured) | preflight at real width | llama-cpp numerics | choice tasks |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for arch, family in sorted(ARCHITECTURES.items()):
        members = [m for m in MATRIX if m.architecture == arch]
        if not members:
            lines.append(f"| {arch} | {family.__name__} | none | | | | | | | | |")
            continue
        names = ", ".join(m.name + (" (synthetic)" if m.synthetic else "") for m in members)
        if not any(m.experts for m in members):
            sliced = "no routed experts"
        elif family.sliceable_experts:
            sliced = "yes"
        else:
            sliced = "held whole: a budget below the layer is refused"
        bounds = ", ".join(f"{m.bfloat16_nats:g} / {m.measured:.4f}" for m in members)
        preflight = f"yes ({PREFLIGHT_MEASURED[arch]})"
        numerics = f"refused: {NOT_EMULATED[arch]}" if arch in NOT_EMULATED else "yes"
        choices = "packed" if family.packs_sequences else "a row per sequence"
        lines.append(f"| {arch} | {family.__name__} | {names} | yes | yes | {sliced} | yes | {bounds} | {preflight} "
                     f"| {numerics} | {choices} |")
    return lines


def main() -> None:
    print("\n".join(table()))


if __name__ == "__main__":
    sys.exit(main())
