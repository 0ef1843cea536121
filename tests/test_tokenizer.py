"""Token ids equal llama.cpp's (dumps and counts in tests/data/)."""
import pytest

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import load_tokenizer

from .helpers import HEAD40K, REFERENCE, REFERENCE_NAMES

# llama-tokenize over the whole head40k file, BOS included where the model adds one
HEAD40K_COUNTS = {"smollm2-135m": 9471, "gemma3-270m": 9226, "qwen2.5-0.5b": 9300}


@pytest.mark.parametrize("alias", list(HEAD40K_COUNTS))
def test_ids_equal_llama_cpp(alias, model_path):
    tok = load_tokenizer(GGUFIndex(model_path(alias)))
    text = HEAD40K.read_text(encoding="utf-8")
    dump = REFERENCE / f"llama-tokenize.{REFERENCE_NAMES[alias]}.head2000.txt"
    assert tok.encode(text[:2000]) == [int(x) for x in dump.read_text().split()]
    assert len(tok.encode(text)) == HEAD40K_COUNTS[alias]


def test_bos_only_where_the_file_says(model_path):
    smol = load_tokenizer(GGUFIndex(model_path("smollm2-135m")))
    gemma = load_tokenizer(GGUFIndex(model_path("gemma3-270m")))
    assert not smol.add_bos and gemma.add_bos
    assert gemma.encode("Hello")[0] == gemma.bos_id
    assert smol.encode("Hello")[0] != smol.bos_id
    assert smol.encode("Hello", add_bos=True)[0] == smol.bos_id
