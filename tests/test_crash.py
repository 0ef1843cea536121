"""A real pass killed (SIGKILL) at chosen points: the rerun of the same command gives the
bit-identical result and redoes at most one chunk per task (counted from the tasks' journals)."""
import pytest

from pipeline.tools.stress import kill_and_resume, load_settings, result_numbers, run_pass

FAULTS = [
    "chunk-computed@LayerWindow [10..20)#2",   # a chunk computed, nothing written
    "mid-chunk-write@LayerWindow [10..20)#3",  # a half-written chunk file left behind
    "chunk-written@Embed#2",                   # between two chunks
    "manifest-written@LayerWindow [0..10)#1",  # during the completion write
    "task-committed@LayerWindow [20..30)#1",   # between tasks
    "mid-chunk-write@Score#2",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    settings = load_settings()
    root = tmp_path_factory.mktemp("reference")
    code, err = run_pass(root, settings)
    assert code == 0, err
    return settings, result_numbers(root)


@pytest.mark.parametrize("fault", FAULTS)
def test_kill_at_a_chosen_point_then_resume(fault, reference, tmp_path):
    settings, numbers = reference
    outcome = kill_and_resume(tmp_path, settings, numbers, fault=fault)
    assert outcome.killed
    assert outcome.identical
    assert outcome.worst_task <= 1
    expected_redone = 1 if fault.startswith(("chunk-computed", "mid-chunk-write")) else 0
    assert outcome.recomputed == expected_redone


def test_kill_at_a_random_moment_then_resume(reference, tmp_path):
    settings, numbers = reference
    outcome = kill_and_resume(tmp_path, settings, numbers, kill_at=(4, 0.3))  # after the Embed task's third chunk
    assert outcome.killed and outcome.identical and outcome.worst_task <= 1


def test_the_big_model_stress_settings_reach_the_command():
    """configs/stress-30b.toml's budget and dtype are passed to the pass it kills."""
    from pipeline.paths import CONFIGS
    from pipeline.tools.stress import pass_args

    args = pass_args(load_settings(CONFIGS / "stress-30b.toml"))
    pairs = dict(zip(args[::2], args[1::2]))
    assert pairs["--device-memory"] == "12GiB" and pairs["--compute-dtype"] == "bfloat16"
    assert pairs["--window-layers"] == "auto" and pairs["--model"].endswith("synthetic-qwen3-30b-a3b.gguf")
    assert "--device-memory" not in pass_args(load_settings())
