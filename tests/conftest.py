import json
from pathlib import Path

import luigi
import pytest

from pipeline.models import fetch_model
from pipeline.paths import REPO_ROOT

SHARED = REPO_ROOT.parent / "shared"
HEAD40K = SHARED / "corpora" / "wikitext-2-test.head40k.txt"
MODELS = ["smollm2-135m", "gemma3-270m", "qwen2.5-0.5b"]
REFERENCE_NAMES = {"smollm2-135m": "smol", "gemma3-270m": "gemma", "qwen2.5-0.5b": "qwen"}


@pytest.fixture(scope="session")
def model_path():
    """Path of a registered real model, fetched into data/models/ on first use."""
    return fetch_model


def run_pipeline(run_root: Path, **params) -> dict:
    """Run PerplexityRun in-process on the local scheduler; return its result JSON."""
    from pipeline import PerplexityRun

    result = run_root / "result.json"
    task = PerplexityRun(run_root=str(run_root), result_json=str(result), **params)
    summary = luigi.build([task], local_scheduler=True, detailed_summary=True, log_level="WARNING")
    assert summary.status.name in ("SUCCESS", "SUCCESS_WITH_RETRY"), summary.summary_text
    return json.loads(result.read_text())


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """(Hugging Face model, GGUF path) of a tiny random model, built and converted once per session."""
    from .hf_models import tiny_model as build

    root, built = tmp_path_factory.mktemp("tiny-models"), {}

    def get(name: str, outtype: str = "f32"):
        if (name, outtype) not in built:
            built[name, outtype] = build(name, root, outtype)
        return built[name, outtype]
    return get
