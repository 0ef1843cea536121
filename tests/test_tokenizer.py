"""Token ids equal llama.cpp's (dumps and counts in tests/data/)."""
import tomllib

import pytest

from pipeline.errors import UserError
from pipeline.gguf_io.pre_tokenizers import NOT_COMPUTED, PRE_TOKENIZERS
from pipeline.gguf_io.reader import GGUFIndex
from pipeline.gguf_io.tokenizer import load_tokenizer

from .helpers import HEAD40K, REFERENCE, REFERENCE_NAMES
from .tiny_gguf import rewrite_gguf
from .token_dumps import PRE_TEXT, READ_AS_LLAMA, gemma4_vocab, qwen_vocab, read_as_llama_dump

# llama-tokenize over the whole head40k file, BOS included where the model adds one
HEAD40K_COUNTS = {"smollm2-135m": 9471, "gemma3-270m": 9226, "qwen2.5-0.5b": 9300}


@pytest.mark.parametrize("alias", list(HEAD40K_COUNTS))
def test_ids_equal_llama_cpp(alias, model_path):
    tok = load_tokenizer(GGUFIndex(model_path(alias)))
    text = HEAD40K.read_text(encoding="utf-8")
    dump = REFERENCE / f"llama-tokenize.{REFERENCE_NAMES[alias]}.head2000.txt"
    assert tok.encode(text[:2000]) == [int(x) for x in dump.read_text().split()]
    assert len(tok.encode(text)) == HEAD40K_COUNTS[alias]


def test_a_sentencepiece_tokenizer_is_built_once_then_read_back(model_path, tmp_path, monkeypatch):
    """Gemma-3's tokenizer is built at its first use and read back from its entry after (no build,
    the same ids); an entry that cannot be read is built anew; read otherwise (a space prepended),
    the vocabulary is another entry; a BPE vocabulary's tokenizer is built, not kept."""
    from pipeline.gguf_io import tokenizer as module
    from pipeline.gguf_io.tokenizer_cache import entry

    monkeypatch.setattr("pipeline.paths.TOKENIZERS_CACHE", tmp_path)
    gemma = GGUFIndex(model_path("gemma3-270m"))
    text = HEAD40K.read_text(encoding="utf-8")[:2000]
    ids = load_tokenizer(gemma).encode(text)
    built, builds = module.build_tokenizer, []
    monkeypatch.setattr(module, "build_tokenizer", lambda *a: builds.append(a) or built(*a))
    assert load_tokenizer(gemma).encode(text) == ids and not builds
    entry(gemma).write_text("{not a tokenizer")
    assert load_tokenizer(gemma).encode(text) == ids and len(builds) == 1
    gemma.metadata["tokenizer.ggml.add_space_prefix"] = True
    assert load_tokenizer(gemma).encode("Hello") != load_tokenizer(GGUFIndex(model_path("gemma3-270m"))).encode("Hello")
    load_tokenizer(GGUFIndex(model_path("qwen2.5-0.5b")))
    assert len(builds) == 3 and len(list(tmp_path.glob("*.json"))) == 2


def test_bos_only_where_the_file_says(model_path):
    smol = load_tokenizer(GGUFIndex(model_path("smollm2-135m")))
    gemma = load_tokenizer(GGUFIndex(model_path("gemma3-270m")))
    assert not smol.add_bos and gemma.add_bos
    assert gemma.encode("Hello")[0] == gemma.bos_id
    assert smol.encode("Hello")[0] != smol.bos_id
    assert smol.encode("Hello", add_bos=True)[0] == smol.bos_id


def pre_groups() -> list[tuple[str, ...]]:
    """The names llama-tokenize was run for under Qwen2.5's vocabulary, in groups that our table
    gives one rule: one tokenizer built per group, every name's ids checked."""
    groups = {}
    for name in sorted(n for names in MANIFEST["qwen-vocab"].values() for n in names):
        groups.setdefault(PRE_TOKENIZERS[name], []).append(name)
    return [tuple(g) for g in groups.values()]


MANIFEST = tomllib.loads((REFERENCE / "llama-tokenize.pre.toml").read_text())
DUMPS = {name: dump for section in ("qwen-vocab", "gemma4-vocab") for dump, names in MANIFEST[section].items()
         for name in names}


def dump_ids(name: str) -> list[int]:
    return [int(x) for x in (REFERENCE / DUMPS[name]).read_text().split()]


def test_every_pre_tokenizer_of_llama_cpp_is_in_the_table():
    assert set(MANIFEST["llama_cpp_names"]) == set(PRE_TOKENIZERS) | set(NOT_COMPUTED)
    assert set(DUMPS) == set(PRE_TOKENIZERS)   # and every one of them has llama-tokenize's ids


@pytest.fixture(scope="module")
def qwen_vocab_file(model_path, tmp_path_factory):
    return qwen_vocab(model_path("qwen2.5-0.5b"), tmp_path_factory.mktemp("vocab") / "qwen.gguf")


@pytest.fixture
def qwen_vocabulary(qwen_vocab_file):
    """A fresh index of the vocabulary, whose metadata a test may change."""
    return GGUFIndex(qwen_vocab_file)


@pytest.mark.parametrize("names", pre_groups(), ids=lambda g: g[0])
def test_pre_tokenizers_equal_llama_cpp(names, qwen_vocabulary):
    """Qwen2.5's vocabulary (digit merges added, no add_bos_token) under each llama.cpp
    `tokenizer.ggml.pre`: its regexes, merges ignored for whole-token words, its BOS default;
    llama-tokenize's ids of the same text, dumped into tests/data (tests/token_dumps.py)."""
    qwen_vocabulary.metadata["tokenizer.ggml.pre"] = names[0]
    ids = load_tokenizer(qwen_vocabulary).encode(PRE_TEXT)
    for name in names:
        assert ids == dump_ids(name), name


@pytest.mark.parametrize("model, pre", [("gemma4", None), ("gpt2", "granite-embed-multi-311m"),
                                        ("gpt2", "sarvam-moe")])
def test_raw_utf8_vocabularies_equal_llama_cpp(model, pre, model_path, tmp_path):
    """Gemma 4's form (raw UTF-8 pieces, spaces as ▁, <0xXX> byte fallback, BOS whatever the
    file says), built from Gemma 3's pieces, as the tokenizer model `gemma4` and as the pre values
    that take it under `gpt2`."""
    vocab = gemma4_vocab(model_path("gemma3-270m"), tmp_path / "vocab.gguf", model, pre)
    assert load_tokenizer(GGUFIndex(vocab)).encode(PRE_TEXT) == dump_ids(pre or model)


def test_a_pre_tokenizer_not_computed_is_refused_in_one_line(qwen_vocabulary):
    qwen_vocabulary.metadata["tokenizer.ggml.pre"] = "whitespace"
    with pytest.raises(UserError, match="BPE pre-tokenizer 'whitespace' is not supported .an embedding model"):
        load_tokenizer(qwen_vocabulary)
    qwen_vocabulary.metadata["tokenizer.ggml.pre"] = "llama5"
    with pytest.raises(UserError, match="BPE pre-tokenizer 'llama5' is not supported .not one that llama.cpp knows"):
        load_tokenizer(qwen_vocabulary)


def test_missing_pre_is_default_and_eos_is_added_where_the_file_says(qwen_vocabulary, tmp_path):
    """llama.cpp reads no pre value as `default`; llama-perplexity tokenizes with add_special,
    which appends EOS where tokenizer.ggml.add_eos_token is true."""
    del qwen_vocabulary.metadata["tokenizer.ggml.pre"]
    assert load_tokenizer(qwen_vocabulary).encode(PRE_TEXT) == dump_ids("default")
    qwen_vocabulary.metadata["tokenizer.ggml.add_eos_token"] = True
    ids = load_tokenizer(qwen_vocabulary).encode("Hello")
    assert ids[-1] == qwen_vocabulary.metadata["tokenizer.ggml.eos_token_id"] and len(ids) == 2


@pytest.mark.parametrize("pre, add_bos, bos_id", [("llama3", True, 1), ("qwen2", False, 1), ("glm4", False, None)])
def test_a_run_adds_bos_as_llama_cpp_decides(pre, add_bos, bos_id, model_path, tmp_path):
    """Without add_bos_token in the file, --bos auto follows llama.cpp's default for the
    pre-tokenizer (the Llama 3 group adds one, GLM defines none), in the tokens and at each
    sequence's start (llama-perplexity's chunks)."""
    from pipeline.run.spec import resolve_run

    path = rewrite_gguf(model_path("smollm2-135m"), tmp_path / f"{pre}.gguf",
                        metadata={"tokenizer.ggml.pre": pre, "tokenizer.ggml.add_bos_token": None})
    spec = resolve_run(str(path), "python-docs", "", "", "", 128, 0, -1, 2, "auto")
    assert (spec.method.bos, spec.bos_id) == (add_bos, bos_id)
    assert (load_tokenizer(GGUFIndex(path)).encode("Hello")[0] == 1) == add_bos   # SmolLM2's BOS is 1


@pytest.mark.parametrize("alias", ["smollm2-135m", "qwen2.5-0.5b"])
@pytest.mark.parametrize("escape", [False, True])
def test_a_corpus_is_read_byte_for_byte_as_llama_perplexity_reads_it(alias, escape, model_path):
    """WikiText-2 with CRLF line ends and Python's documentation of string escapes: the llama-cpp
    method's ids are llama-tokenize's of the file without its final newline (as llama-perplexity
    reads -f: CRs kept), escapes left as they are (llama-perplexity's default) or processed
    (--escape, its -e); the stride method reads the file as it is."""
    from pipeline.run.modes import mode_of
    from pipeline.run.spec import resolve_run

    model_path(alias)
    expected = [int(i) for i in read_as_llama_dump(alias, escape).read_text().split()]
    spec = resolve_run(alias, "wikitext-2", str(READ_AS_LLAMA), "", "llama-cpp", 128, 0, -1, 0, "auto", escape=escape)
    assert mode_of("llama-cpp").plan(spec).tokens.tolist() == expected
    if not escape:
        stride = resolve_run(alias, "wikitext-2", str(READ_AS_LLAMA), "", "stride", 128, 0, -1, 0, "auto")
        text = READ_AS_LLAMA.read_bytes().decode("utf-8")
        assert "\r\n" in text and text.count("\\") > 10
        assert mode_of("stride").plan(stride).tokens.tolist() == load_tokenizer(GGUFIndex(model_path(alias))).encode(
            text, add_bos=stride.method.bos)


def test_escapes_apply_to_text_read_as_llama_perplexity_reads_it_only(tmp_path):
    from pipeline.run.spec import resolve_run

    for method in ("stride", "multiple-choice"):
        with pytest.raises(UserError, match=f"--escape applies to .* not to the {method} method"):
            resolve_run("smollm2-135m", "wikitext-2", str(READ_AS_LLAMA), "", method, 128, 0, -1,
                        -1 if method == "multiple-choice" else 0, "auto", escape=True)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"text \\xff\\xfe more")               # escapes making bytes that are not UTF-8
    spec = resolve_run("smollm2-135m", "wikitext-2", str(bad), "", "llama-cpp", 128, 0, -1, 0, "auto", escape=True)
    from pipeline.run.modes import mode_of

    with pytest.raises(UserError, match="escape sequences make bytes that are not UTF-8"):
        mode_of("llama-cpp").plan(spec)


@pytest.mark.parametrize("method, dropped", [("llama-cpp", True), ("stride", False)])
def test_the_llama_cpp_method_reads_a_corpus_without_its_last_newline(method, dropped, model_path, tmp_path):
    """llama-perplexity reads its -f file without the last newline, and here " \\n \\n" and " \\n "
    end in other tokens: the llama-cpp method's tokens are its, the stride method's the file's."""
    from pipeline.run.modes import mode_of
    from pipeline.run.spec import resolve_run

    text = HEAD40K.read_text(encoding="utf-8")[:3000] + " \n \n"
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(text, encoding="utf-8")
    spec = resolve_run("smollm2-135m", "wikitext-2", str(corpus), "", method, 128, 0, -1, 0, "auto")
    tok = load_tokenizer(GGUFIndex(model_path("smollm2-135m")))
    read = text[:-1] if dropped else text
    assert tok.encode(text[:-1], add_bos=True)[-1] != tok.encode(text, add_bos=True)[-1]
    assert mode_of(spec.method.name).plan(spec).tokens.tolist() == tok.encode(read, add_bos=spec.method.bos)
