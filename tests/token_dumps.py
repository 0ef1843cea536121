"""The test vocabularies of the pre-tokenizers, and llama-tokenize's ids of one sample text under
each `tokenizer.ggml.pre` value of llama.cpp (tests/data/llama-tokenize.pre.toml and the dumps it
names). `python -m tests.token_dumps` writes them anew: llama-tokenize is built once from the
sources that llama-cpp-python 0.3.36 vendors, the pre values are read from its llama-vocab.cpp."""
import re
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, GGUFWriter, Keys, TokenType

from pipeline.gguf_io.reader import GGUFIndex

from .helpers import HEAD40K, REFERENCE

LLAMA_CPP_PYTHON = "0.3.36"
MANIFEST = REFERENCE / "llama-tokenize.pre.toml"
# what tells the pre-tokenizers apart: case changes inside words, digit runs, contractions,
# punctuation before letters, CJK, accents (precomposed and combining), emoji, slashes, tabs,
# whitespace runs (ideographic and no-break spaces too), blank lines, code
SPLIT_CASES = ("CamelCaseWords HTTPServer parseJSON iPhone don't I'M WE'LL 1234567 3.14159 2024-12-02\n"
               "naïve café Ünïcödé ÀÉÎ cafe\u0301 nai\u0308ve 東京タワー 北京大学 ひらがな 한국어 ¿Qué? «quoted»\n"
               "a/b/c //path\n\n"
               "\t tabbed\r\n<tag attr=\"x\">(f(x)=y); x+=1 @user #tag $5.00 100% ...!!! --flag __init__\n"
               "Emoji: 👍🏽 🎉🎉 ❤️ 🇫🇷 and digits 1 12 123 1234 12345 123456 ١٢٣ ½ ²\n"
               "    four spaces,   three,\u3000ideographic space, non\u00a0breaking\n\n\n"
               "def f(x):\n    return {'a': x**2, \"b\": [1, 2]}  # it's code\n\tif x >= 10 and y != 3: pass\n"
               "Ελληνικά Русский текст עברית العربية हिन्दी ไทย\n"
               "it's It'S THEY'RE we've I'd you'll")
PRE_TEXT = HEAD40K.read_text(encoding="utf-8")[:2000] + "\n" + SPLIT_CASES
# Qwen2.5 splits every digit, so merges of digits in twos and threes are added for groupings to
# show; and it has no merge of a letter with a combining mark (e + U+0301, i + U+0308, in GPT-2's
# byte alphabet), so ranked first, those show whether a pre-tokenizer keeps marks in words
DIGIT_MERGES = [("1", "2"), ("12", "3"), ("4", "5"), ("45", "6"), ("6", "7"), ("2", "0"), ("20", "2"),
                ("1", "0"), ("10", "0"), ("1", "4"), ("14", "1"), ("5", "9"), ("3", "4")]
MARK_MERGES = [("Ì", "Ī"), ("e", "Ìģ"), ("i", "ÌĪ")]


def qwen_vocab(qwen: Path, out: Path) -> Path:
    """Qwen2.5's 151,936-entry byte-level vocabulary, the digit merges appended, the mark merges
    put first, no add_bos_token (so each pre-tokenizer's own BOS default shows)."""
    index = GGUFIndex(qwen)
    tokens, merges = index.strings(Keys.Tokenizer.LIST), index.strings(Keys.Tokenizer.MERGES)
    types = np.asarray(index.metadata[Keys.Tokenizer.TOKEN_TYPE]).tolist()
    added = MARK_MERGES + DIGIT_MERGES
    return write_vocab(out, "gpt2", "qwen2", tokens + [a + b for a, b in added],
                       types + [int(TokenType.NORMAL)] * len(added),
                       [f"{a} {b}" for a, b in MARK_MERGES] + merges + [f"{a} {b}" for a, b in DIGIT_MERGES],
                       index.metadata[Keys.Tokenizer.BOS_ID], index.metadata[Keys.Tokenizer.EOS_ID], add_bos=None)


def gemma4_vocab(gemma3: Path, out: Path, model: str = "gemma4", pre: str | None = None) -> Path:
    """A vocabulary in Gemma 4's form (raw UTF-8 pieces, spaces as ▁, <0xXX> byte tokens, merges)
    from Gemma 3's SentencePiece pieces: its first 32,768 entries and every single character,
    merges ranked by the pieces' scores; add_bos_token false (llama.cpp adds BOS for Gemma 4)."""
    index = GGUFIndex(gemma3)
    tokens = index.strings(Keys.Tokenizer.LIST)
    scores = np.asarray(index.metadata[Keys.Tokenizer.SCORES])
    types = np.asarray(index.metadata[Keys.Tokenizer.TOKEN_TYPE])
    keep = [i for i, t in enumerate(tokens) if i < 32768 or len(t) == 1]
    kept = {tokens[i]: n for n, i in enumerate(keep)}
    ranked = sorted((-scores[i], i, left, right) for i in keep if types[i] == TokenType.NORMAL and " " not in tokens[i]
                    for k in range(1, len(tokens[i]))
                    if (left := tokens[i][:k]) in kept and (right := tokens[i][k:]) in kept)
    return write_vocab(out, model, pre, [tokens[i] for i in keep], [int(types[i]) for i in keep],
                       [f"{left} {right}" for *_, left, right in ranked], kept["<bos>"], kept["<eos>"], add_bos=False)


def write_vocab(out: Path, model: str, pre: str | None, tokens: list[str], types: list[int], merges: list[str],
                bos: int, eos: int, add_bos: bool | None) -> Path:
    """A GGUF of a tokenizer alone (llama-tokenize reads the vocabulary only)."""
    w = GGUFWriter(str(out), "llama")
    w.add_tokenizer_model(model)
    if pre:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(bos)
    w.add_eos_token_id(eos)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def with_pre(vocab: Path, name: str, out: Path) -> Path:
    """`vocab` with tokenizer.ggml.pre set to `name`: its entry's bytes replaced in place of a
    rewrite (a vocabulary without tensors has no offsets to move)."""
    raw = vocab.read_bytes()
    start, end = GGUFIndex(vocab).spans[Keys.Tokenizer.PRE]
    key, value = Keys.Tokenizer.PRE.encode(), name.encode()
    entry = struct.pack("<Q", len(key)) + key + struct.pack("<IQ", GGUFValueType.STRING, len(value)) + value
    out.write_bytes(raw[:start] + entry + raw[end:])
    return out


def llama_cpp_pre_names(llama_cpp: Path) -> list[str]:
    """Every `tokenizer.ggml.pre` value llama-vocab.cpp names, in its order."""
    source = (llama_cpp / "src" / "llama-vocab.cpp").read_text(encoding="utf-8")
    start = source.index('tokenizer_pre == "default"')
    return re.findall(r'tokenizer_pre == "([^"]+)"', source[start:source.index("unknown pre-tokenizer type", start)])


def llama_tokenize(binary: Path, vocab: Path, text_file: Path) -> list[int] | None:
    done = subprocess.run([str(binary), "-m", str(vocab), "-f", str(text_file), "--ids", "--no-parse-special",
                           "--log-disable", "--no-escape"], capture_output=True, text=True)
    return [int(x) for x in done.stdout.strip().strip("[]").split(", ")] if done.returncode == 0 else None


def main() -> None:
    from pipeline.gguf_io.registry import fetch_model
    from pipeline.tools.llamacpp import llama_cpp_source, llama_tool

    binary = llama_tool(LLAMA_CPP_PYTHON, "llama-tokenize")
    names = llama_cpp_pre_names(llama_cpp_source(LLAMA_CPP_PYTHON))
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        text = tmp / "sample.txt"
        text.write_bytes(PRE_TEXT.encode("utf-8"))
        qwen = qwen_vocab(fetch_model("qwen2.5-0.5b"), tmp / "qwen.gguf")
        sections = {"qwen-vocab": {}, "gemma4-vocab": {}}
        for name in names:
            if name in ("gemma4", "granite-embed-multi-311m", "sarvam-moe"):   # raw UTF-8: Gemma 4's form
                vocab = gemma4_vocab(fetch_model("gemma3-270m"), tmp / f"{name}.gguf", *(
                    ("gemma4",) if name == "gemma4" else ("gpt2", name)))
                section = "gemma4-vocab"
            else:
                vocab = with_pre(qwen, name, tmp / "pre.gguf")
                section = "qwen-vocab"
            ids = llama_tokenize(binary, vocab, text)
            if ids is None:
                print(f"{name}: llama-tokenize failed", file=sys.stderr)
                continue
            sections[section].setdefault(tuple(ids), []).append(name)
    lines = ["# llama-tokenize's ids of tests/token_dumps.py's sample under each tokenizer.ggml.pre value",
             "# of llama.cpp (llama-cpp-python 0.3.36), one dump per distinct ids: `python -m tests.token_dumps`",
             f"llama_cpp_names = {names!r}".replace("'", '"')]
    for section, dumps in sections.items():
        lines.append(f"\n[{section}]")
        for ids, group in dumps.items():
            dump = f"llama-tokenize.{section}.{group[0]}.txt"
            (REFERENCE / dump).write_text("".join(f"{i}\n" for i in ids))
            lines.append(f'"{dump}" = {group!r}'.replace("'", '"'))
    MANIFEST.write_text("\n".join(lines) + "\n")


# llama-perplexity reads -f as bytes (CRs kept), one final newline dropped, escapes processed only
# with -e: WikiText-2's opening with CRLF line ends, then Python's documentation of string escapes
READ_AS_LLAMA = REFERENCE / "corpus.crlf-escapes.txt"
READ_AS_LLAMA_MODELS = {"smollm2-135m": "smol", "qwen2.5-0.5b": "qwen"}


def read_as_llama_text() -> bytes:
    import pydoc_data.topics

    wikitext = HEAD40K.read_text(encoding="utf-8")[:3000].replace("\n", "\r\n")
    strings = pydoc_data.topics.topics["strings"]
    return (wikitext + strings[strings.index("Both string and bytes"):][:4000].replace("\n", "\r\n")
            + "\r\n").encode("utf-8")


def read_as_llama_dump(alias: str, escaped: bool) -> Path:
    read = "escaped" if escaped else "raw"
    return REFERENCE / f"llama-tokenize.{READ_AS_LLAMA_MODELS[alias]}.crlf-escapes.{read}.txt"


def write_read_as_llama_dumps() -> None:
    """The sample file, and llama-tokenize's ids of it as llama-perplexity reads it (its final
    newline dropped), escapes left as they are and processed, for SmolLM2 and Qwen2.5."""
    from pipeline.gguf_io.registry import fetch_model
    from pipeline.tools.llamacpp import llama_tool

    binary = llama_tool(LLAMA_CPP_PYTHON, "llama-tokenize")
    READ_AS_LLAMA.write_bytes(read_as_llama_text())
    with tempfile.TemporaryDirectory() as tmp:
        prompt = Path(tmp) / "prompt.txt"
        prompt.write_bytes(READ_AS_LLAMA.read_bytes().removesuffix(b"\n"))
        for alias in READ_AS_LLAMA_MODELS:
            for escaped in (False, True):
                flags = ["--escape"] if escaped else ["--no-escape"]
                done = subprocess.run([str(binary), "-m", str(fetch_model(alias)), "-f", str(prompt), "--ids",
                                       "--no-parse-special", "--log-disable", *flags],
                                      capture_output=True, text=True, check=True)
                ids = [int(x) for x in done.stdout.strip().strip("[]").split(", ")]
                read_as_llama_dump(alias, escaped).write_text("".join(f"{i}\n" for i in ids))


if __name__ == "__main__":
    main()
    write_read_as_llama_dumps()
