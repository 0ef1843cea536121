"""Token ids equal llama.cpp's (dumps and counts in tests/data/)."""
import pytest

from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import load_tokenizer

from .helpers import HEAD40K, REFERENCE, REFERENCE_NAMES
from .tiny_gguf import rewrite_gguf

# what tells the pre-tokenizers apart: case changes inside words, digit runs, contractions,
# punctuation before letters, CJK, accents (precomposed and combining), slashes, tabs and blank lines
SPLIT_CASES = ("CamelCaseWords HTTPServer parseJSON iPhone don't I'M WE'LL 1234567 3.14159 2024-12-02\n"
               "naïve café Ünïcödé ÀÉÎ cafe\u0301 nai\u0308ve 東京タワー 北京大学 ひらがな 한국어 ¿Qué? «quoted»\n"
               "a/b/c //path\n\n"
               "\t tabbed\r\n<tag attr=\"x\">(f(x)=y); x+=1 @user #tag $5.00 100% ...!!! --flag __init__")
PRE_TEXT = HEAD40K.read_text(encoding="utf-8")[:2000] + "\n" + SPLIT_CASES

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


@pytest.mark.parametrize("pre", ["deepseek-v3", "gpt-4o", "llama4", "minimax-m2", "tekken", "glm4", "kimi-k2",
                                 "qwen35"])
def test_pre_tokenizers_of_the_biggest_families_equal_llama_cpp(pre, model_path, tmp_path):
    """Qwen2.5's 151k-token vocabulary under each family's `tokenizer.ggml.pre` (its regexes,
    merges ignored for whole-token words, BOS rules): llama-tokenize's ids of the same text,
    dumped into tests/data."""
    vocab = rewrite_gguf(model_path("qwen2.5-0.5b"), tmp_path / "vocab.gguf", lambda n, q, d: None,
                         metadata={"tokenizer.ggml.pre": pre})
    dump = REFERENCE / f"llama-tokenize.qwen-vocab.{pre}.txt"
    assert load_tokenizer(GGUFIndex(vocab)).encode(PRE_TEXT) == [int(x) for x in dump.read_text().split()]
