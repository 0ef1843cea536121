"""`python -m pipeline.tools.explain`: a family's layer shown by the code that runs it, and a
file's layers kind by kind with the shapes a window holds, without reading a weight."""
import pytest

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.tools import explain


def test_an_architecture_is_shown_by_its_layer_and_its_graph(capsys):
    assert explain.main(["gemma3"]) == 0
    out = capsys.readouterr().out
    assert "computed by Gemma3 (pipeline/model/arch/gemma3.py)" in out
    assert "Its graph (PrePostNormLayer.forward" in out
    # the graph's own line: each block's output normed before it joins the stream
    assert "self.post_norm(self.ffn(self.norm(h, self.ffn_norm)), self.ffn_post_norm)" in out
    assert "Settings computed beyond those every family reads: " in out and "gemma3.final_logit_softcapping" in out


def test_a_file_is_shown_kind_by_kind_without_reading_a_weight(tiny_model, capsys, monkeypatch):
    _, path = tiny_model("nemotron_h")                               # layers: Mamba2, MLP, attention, Mamba2, MLP

    def refuse(self, name):
        raise AssertionError(f"{name} was read")

    monkeypatch.setattr(GGUFIndex, "raw", refuse)
    assert explain.main([str(path), "--compute-dtype", "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "5 layers, hidden 64" in out and "held for bfloat16 compute" in out
    kinds = [line for line in out.splitlines() if line.startswith("Layers ")]
    assert kinds == ["Layers 0, 3:", "Layers 1, 4:", "Layers 2:"]
    mamba = out.split("Layers 0, 3:")[1].split("Layers 1, 4:")[0]
    assert "Mamba2(" in mamba and "A: [4, 1] float32" in mamba          # A held in float32 in bfloat16 windows
    assert "in: [" in mamba and "] bfloat16" in mamba


def test_an_unknown_model_is_one_line(capsys):
    assert explain.main(["no-such-family"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ERROR: layercycle: model 'no-such-family'")


@pytest.mark.parametrize("arch", sorted(explain.ARCHITECTURES))
def test_every_family_shows_a_graph(arch, capsys):
    assert explain.main([arch]) == 0
    assert "Its graph (" in capsys.readouterr().out
