"""A NaN or inf is never a result: a pass over a model whose weights give one stops with one
line naming the task and the chunk, a non-zero exit and no result file."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from .helpers import HEAD40K, assert_one_line_error, luigi_cli
from .tiny_gguf import rewrite_gguf

ARGS = ["--task", "wikitext-2", "--corpus", str(HEAD40K), "--ctx", "128", "--chunks", "4", "--sequences-per-chunk", "2",
        "--window-layers", "8"]


def with_one_value(src, dst, tensor: str, value: float):
    def transform(name, qtype, data):
        if name == tensor:
            assert qtype == GGMLQuantizationType.F32, qtype
            data = data.copy()
            data.flat[5] = value
        return data, qtype
    return rewrite_gguf(src, dst, transform)


@pytest.mark.parametrize("tensor,value,where", [
    ("blk.12.attn_norm.weight", np.inf, "LayerWindow [8..16) cpu: a NaN or inf in chunk 0"),
    ("output_norm.weight", np.nan, "Score: a NaN or inf in chunk 0"),
])
def test_a_non_finite_number_stops_the_pass(tensor, value, where, tmp_path, model_path):
    model = with_one_value(model_path("smollm2-135m"), tmp_path / "broken.gguf", tensor, value)
    result = tmp_path / "result.json"
    done = luigi_cli("--model", str(model), *ARGS, "--result-json", str(result), run_root=tmp_path / "runs")
    assert_one_line_error(done, where)
    assert done.returncode == 30 and not result.exists()
