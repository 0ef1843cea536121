"""The conformance matrix (pipeline/tools/architectures.py): every member, a tiny model of one
architecture, through the Luigi tasks: cycled, split, sliced, sharded and resumed passes give the
whole trunk's NLL bit for bit, bfloat16 stays within the member's bound, llama-cpp numerics come to
llama-perplexity's and hold through the windows; and no architecture of the registry is left out."""
import multiprocessing
import os
import random
import signal

import pytest
import torch
import torch.nn.functional as F

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import bos_rule
from pipeline.model.arch import ARCHITECTURES, load_architecture
from pipeline.model.arch.experts import expert_tensor_names
from pipeline.numerics import MODES, NOT_EMULATED, check_emulated, set_numerics
from pipeline.store import outputs
from pipeline.tools.architectures import MATRIX, Member, sliced_windows

from .helpers import forward, random_ids, run_pipeline
from .hf_models import member_in_8_bits, synthetic_member
from .numerics_reference import read as llama_perplexity_tokens

BY_NAME = {m.name: m for m in MATRIX}
WITH_EXPERTS = [m.name for m in MATRIX if m.experts]
MEASURED = llama_perplexity_tokens()    # {member: llama-perplexity's tokens and NLLs} (tests/numerics_reference.py)
# two chunks of two sequences and a third of one in each window, so that a kill can fall on any of them
COMMON = dict(chunks=5, sequences_per_chunk=2)


@pytest.fixture(scope="module")
def member_model(tiny_model, tmp_path_factory):
    """The GGUF path of a member, built once per session (converted, or written by the synthetic writer)."""
    root, written = tmp_path_factory.mktemp("members"), {}

    def get(m: Member):
        if not m.synthetic:
            return tiny_model(m.name)[1]
        if m.name not in written:
            written[m.name] = synthetic_member(m, root, tiny_model(m.synthetic["tokenizer_from"])[1])
        return written[m.name]
    return get


@pytest.fixture(scope="module")
def whole(member_model, tmp_path_factory):
    """The whole trunk's result of a member, run once."""
    done = {}

    def get(m: Member) -> dict:
        if m.name not in done:
            root = tmp_path_factory.mktemp(f"whole-{m.name}")
            done[m.name] = run_pipeline(root, window_layers=0, **params(m, member_model))
        return done[m.name]
    return get


def params(m: Member, member_model) -> dict:
    return dict(model=str(member_model(m)), ctx=m.ctx, **COMMON)


def same_numbers(a: dict, b: dict) -> bool:
    return a["mean_nll"] == b["mean_nll"] and [w["mean_nll"] for w in a["per_window"]] == [
        w["mean_nll"] for w in b["per_window"]]


def test_every_architecture_has_a_member():
    assert {m.architecture for m in MATRIX} == set(ARCHITECTURES)


@pytest.mark.parametrize("name", BY_NAME)
def test_the_member_is_what_the_matrix_says(name, member_model):
    gguf = GGUFIndex(member_model(BY_NAME[name]))
    assert gguf.architecture == BY_NAME[name].architecture
    n_layers = load_architecture(gguf).hp.n_layers
    assert any(expert_tensor_names(gguf, i) for i in range(n_layers)) == BY_NAME[name].experts


@pytest.mark.parametrize("name", BY_NAME)
def test_gpu_layers_split_equals_whole(name, member_model, whole, tmp_path):
    # --gpu-layers 2 --first-layer 1, the CPU standing in for the device: the layers before and
    # after the placed ones run in CPU windows of their own
    m = BY_NAME[name]
    split = run_pipeline(tmp_path, gpu_layers=2, first_layer=1, window_layers=1, **params(m, member_model))
    n_layers = split["model"]["n_layers"]
    after = [(3, n_layers)] if n_layers > 3 else []
    assert [(w["first"], w["last"]) for w in split["placement"]] == [(0, 1), (1, 2), (2, 3), *after]
    assert same_numbers(split, whole(m))


@pytest.mark.parametrize("name", WITH_EXPERTS)
def test_expert_slices_equal_the_held_layers(name, member_model, whole, tmp_path, monkeypatch):
    """Every layer with routed experts in a window of its own, its experts in two slices (the
    window task's sliced path: staged, slice by slice into the accumulator, finished); a family
    that holds its experts whole is refused by the planner, naming the budget that runs."""
    from pipeline import PerplexityRun
    from pipeline.run import preflight

    m = BY_NAME[name]
    gguf = GGUFIndex(member_model(m))
    arch = load_architecture(gguf)
    moe = [i for i in range(arch.hp.n_layers) if expert_tensor_names(gguf, i)]
    if not arch.sliceable_experts:
        run = PerplexityRun(device="cpu", run_root=str(tmp_path), window_layers="auto", **params(m, member_model))
        per_layer, _ = preflight.layer_costs(gguf, arch.hp.n_layers, torch.float32)
        fixed = preflight.window_fixed_bytes(gguf, run.sequences_per_chunk, run.spec().method.ctx, arch.hp.n_head)
        budget = (fixed + max(per_layer[i] for i in moe)) // 1024 - 1
        with pytest.raises(UserError, match=r"layer \d+ on cpu needs .* the smallest budget that works is \d+ MiB"):
            PerplexityRun(device="cpu", run_root=str(tmp_path), device_memory=f"{budget}KiB",
                          **params(m, member_model)).placement(check_memory=False)
        return
    windows = sliced_windows(gguf, "cpu")
    monkeypatch.setattr(PerplexityRun, "placement", lambda self, *args, **kwargs: windows)
    sliced = run_pipeline(tmp_path, **params(m, member_model))
    assert [w["expert_slices"] for w in sliced["placement"]] == [w.expert_slices for w in windows]
    assert same_numbers(sliced, whole(m))


def run_killed(root, fault: str, params: dict) -> None:
    """A pass that the failpoint `fault` kills (SIGKILL); reaching its end is an error."""
    os.environ["LAYERCYCLE_FAULT"] = fault
    run_pipeline(root, **params)
    os._exit(1)


@pytest.fixture(scope="module")
def killable():
    """Processes forked from a server that imported the package and never computed: each starts
    at once, with torch's thread pool of its own (one forked from a process that computed hangs
    in it), on as many threads as the tests' process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["pipeline", "tests.helpers", "tests.test_conformance"])
    return context


@pytest.mark.parametrize("name", BY_NAME)
def test_cycled_sharded_killed_and_resumed_equals_whole(name, member_model, whole, tmp_path, killable):
    """A pass in 1-layer windows and 2 shards, killed (SIGKILL) once a chunk of a window drawn by the
    member's name is written, resumes in that window's task and gives the whole trunk's numbers:
    every figure of it computed in 1-layer windows, in one shard or the other."""
    m = BY_NAME[name]
    common = dict(params(m, member_model), window_layers=1, shards=2)
    draw = random.Random(name)
    layer, chunk = draw.randrange(whole(m)["model"]["n_layers"]), draw.randrange(1, 3)
    root = tmp_path / "killed"
    fault = f"chunk-written@LayerWindow [{layer}..{layer + 1})#{chunk}"
    killed = killable.Process(target=run_killed, args=(root, fault, common))
    killed.start()
    killed.join()
    assert killed.exitcode == -signal.SIGKILL
    (partial,) = (root / "LayerWindow").glob("*.partial")
    resumed = run_pipeline(root, **common)
    assert len(resumed["placement"]) == resumed["model"]["n_layers"]
    assert same_numbers(resumed, whole(m))
    manifest = outputs.read_manifest(partial.with_name(partial.name.removesuffix(".partial")))
    assert manifest["identity"]["layers"] == [layer, layer + 1] and manifest["identity"]["shard"][1] == 2
    assert manifest["chunks_found"] > 0 and manifest["chunks_found"] + manifest["chunks_computed"] == manifest["chunks"]


@pytest.mark.parametrize("name", BY_NAME)
def test_bfloat16_stays_within_the_members_bound(name, member_model):
    # routers, norms and recurrent scans stay in float32: only the matrix products round
    m = BY_NAME[name]
    path = member_model(m)
    ids = random_ids()
    exact, rounded = forward(path, ids), forward(path, ids, torch.bfloat16)
    nll = [torch.nn.functional.cross_entropy(x[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).item()
           for x in (exact, rounded)]
    assert torch.isfinite(rounded).all()
    assert abs(nll[1] - nll[0]) <= m.bfloat16_nats


def span_nll(logits: torch.Tensor, plan) -> list[torch.Tensor]:
    """The NLL of each span's targets from logits [rows, T, vocab] of the plan's rows."""
    out = []
    for _, row, lo, hi, first_from in plan.spans_of(range(plan.n_sequences)):
        at = torch.tensor([first_from, *range(lo, hi - 1)])
        out.append(F.cross_entropy(logits[row, at], torch.from_numpy(plan.ids[row, lo:hi]).long(), reduction="none"))
    return out


def choice_tasks(vocab: int) -> tuple:
    """Three tasks of random ids: shared tokens (those of the third, none), then 2-3 choices of their own."""
    from pipeline.run.modes.choice import Choice, ChoiceTask

    ids = iter((random_ids(n_rows=1, n_tokens=200, seed=7)[0] % vocab).tolist())
    tasks = []
    for shared, own in ((9, (5, 3, 7)), (4, (6, 2)), (0, (4, 5))):
        head = [next(ids) for _ in range(shared)]
        choices = []
        for n in own:
            tokens = (*head, *(next(ids) for _ in range(n)))
            choices.append(Choice(tokens, max(1, shared), len(tokens)))
        tasks.append(ChoiceTask(len(tasks), 0, tuple(choices)))
    return tuple(tasks)


@pytest.mark.parametrize("name", BY_NAME)
def test_packed_rows_give_each_sequences_own_row_scores(name, member_model):
    """A choice task's sequences packed (shared tokens once, each choice a branch; two tasks in a
    row, padding after them) score as each in a row of its own, within float reassociation (a
    recurrent scan's blocks fall elsewhere: 1.5e-4 measured), in a family that packs; one that does
    not (`packs_sequences = False`: keys selected by their place in the row) has the executor refuse
    packed rows, and its plans keep a row per sequence."""
    from pipeline.run.modes.choice import choice_rows, packed_rows, packs, task_width

    m = BY_NAME[name]
    path = member_model(m)
    gguf = GGUFIndex(path)
    arch = load_architecture(gguf)
    tasks = choice_tasks(arch.hp.vocab)
    assert packs(gguf) == arch.packs_sequences
    # rows of the first and third tasks (the third shares no token: its branches start from zeros), then
    # the second, each row padded
    packed = packed_rows(tasks, task_width(tasks[0]) + task_width(tasks[2]) + 1)
    single = choice_rows([c for t in tasks for c in t.choices], max(c.width for t in tasks for c in t.choices))
    assert packed.n_sequences == 2 and packed.layout[0, -1, 1] == 2 and packed.rows()[-1] == 0
    as_ids = [torch.from_numpy(p.ids).long() for p in (packed, single)]
    layout = torch.from_numpy(packed.layout).long()
    if not arch.packs_sequences:
        with pytest.raises(ValueError, match="does not compute packed rows"):
            forward(path, as_ids[0], layout=layout)
        return
    got = span_nll(forward(path, as_ids[0], layout=layout), packed)
    want = span_nll(forward(path, as_ids[1]), single)
    worst = max((a - b).abs().max().item() for a, b in zip(got, want, strict=True))
    assert worst <= 5e-4, worst


def test_llama_cpp_numerics_are_measured_for_every_architecture_they_emulate():
    emulated = set(ARCHITECTURES) - set(NOT_EMULATED)
    assert emulated <= {BY_NAME[name].architecture for name in MEASURED}
    for architecture in NOT_EMULATED:
        with pytest.raises(UserError, match=f"not emulated for the {architecture} architecture"):
            check_emulated("llama-cpp", architecture)


@pytest.mark.parametrize("name", sorted(n for n in MEASURED if BY_NAME[n].architecture not in NOT_EMULATED))
def test_llama_cpp_numerics_give_llama_perplexitys_nll(name, tiny_model, tmp_path):
    """The member in 8 bits over llama-perplexity's 32 chunks: in llama-cpp numerics at least 10% of
    the scored tokens have llama-perplexity's NLL within 1e-3 nats (to its base file's 16 bits),
    in exact numerics fewer. Where the computation is llama.cpp's, a chunk agrees until a value
    falls on the other side of a rounding (a last-bit difference upstream, the order of a sum) and
    the rest of the chunk draws apart. Measured: 15-94% of the tokens in llama-cpp numerics, at most
    3% in exact numerics, and at most 3% with one rounding of latent attention left out (the
    float16 cache, or one of its two per-head products' inputs)."""
    m = BY_NAME[name]
    tokens, reference = MEASURED[name]
    path = member_in_8_bits(m, tmp_path, tiny_model)
    ids = torch.from_numpy(tokens).long()                                     # [chunks, ctx]
    bos, add_bos = bos_rule(GGUFIndex(path))
    if add_bos:                                                               # as llama-perplexity puts it in
        ids[:, 0] = bos
    first = ids.shape[1] - reference.shape[1]                                 # the first scored target
    agree = {}
    for mode in MODES:
        set_numerics(mode, m.architecture)
        try:
            logits = forward(path, ids)[:, first - 1:-1]                      # [chunks, scored, vocab]
        finally:
            set_numerics("exact", m.architecture)
        nll = F.cross_entropy(logits.transpose(1, 2), ids[:, first:], reduction="none")
        agree[mode] = ((nll - torch.from_numpy(reference)).abs() < 1e-3).float().mean().item()
    assert agree["exact"] < 0.1 <= agree["llama-cpp"], agree


@pytest.mark.parametrize("name", sorted(n for n in BY_NAME if BY_NAME[n].architecture not in NOT_EMULATED))
def test_llama_cpp_numerics_in_one_layer_windows_equal_the_whole_trunk(name, tiny_model, tmp_path):
    """The member in 8 bits through the Luigi tasks in llama-cpp numerics: 1-layer windows give the
    whole trunk's numbers in the mode bit for bit (the mode holds in every window task, for the
    layers it reads and the cache it rounds), and those are not exact numerics' numbers. A window
    task that computed in exact numerics fails it."""
    m = BY_NAME[name]
    run = dict(model=str(member_in_8_bits(m, tmp_path, tiny_model)), ctx=m.ctx, **COMMON)
    whole_trunk = run_pipeline(tmp_path / "whole", window_layers=0, numerics="llama-cpp", **run)
    cycled = run_pipeline(tmp_path / "cycled", window_layers=1, numerics="llama-cpp", **run)
    assert len(cycled["placement"]) == cycled["model"]["n_layers"] and cycled["numerics"] == "llama-cpp"
    assert same_numbers(cycled, whole_trunk)
    assert not same_numbers(run_pipeline(tmp_path / "exact", window_layers=0, **run), whole_trunk)


def test_the_architecture_page_shows_the_matrix():
    from pipeline.paths import REPO_ROOT
    from pipeline.tools.architectures import MARKERS, table

    page = (REPO_ROOT / "ARCHITECTURES.md").read_text()
    shown = page.split(MARKERS[0], 1)[1].split(MARKERS[1], 1)[0].strip()
    assert shown == "\n".join(table()), "ARCHITECTURES.md is stale: `python -m pipeline.tools.architectures` prints it"
