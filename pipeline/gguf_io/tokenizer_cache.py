"""SentencePiece tokenizers built once. Such a vocabulary's tokenizer is rebuilt from its metadata
at its first use, its merges ranked by the pieces' scores in Python (1.9 s for Gemma-3's 262k
entries), then read back from its serialized form in data/tokenizers/ (0.9 s). A BPE vocabulary's
is built from the file's own merges faster than it reads back (Qwen2.5's: 0.3 s against 0.6 s)
and is not kept. The entry is named by the sha256 of what the build reads (the vocabulary, scores
and types as stored, the tokenizer model, whether a space is prepended) and of the code that builds
it, so another vocabulary or build never reads an entry made for something else."""
import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from gguf import Keys
from tokenizers import Tokenizer

from .. import paths
from .reader import GGUFIndex

BUILT_BY = ("tokenizer.py", "pre_tokenizers.py")    # this package's modules that build a tokenizer


@functools.cache
def code_sha256() -> str:
    h = hashlib.sha256()
    for name in BUILT_BY:
        h.update((Path(__file__).parent / name).read_bytes())
    return h.hexdigest()


# the entries a tokenizer is built from as the file stores them; the scalars that choose how, as read
STORED = (Keys.Tokenizer.LIST, Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE)
READ = (Keys.Tokenizer.MODEL, Keys.Tokenizer.ADD_PREFIX)


def entry(gguf: GGUFIndex) -> Path:
    chosen = [repr(gguf.metadata.get(k)) for k in READ]
    key = hashlib.sha256("|".join([gguf.entries_sha256(STORED), *chosen, code_sha256()]).encode()).hexdigest()
    return paths.TOKENIZERS_CACHE / f"{key}.json"


def cached(gguf: GGUFIndex, build: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer build() makes for gguf, read from its entry where one was written. It is
    always the serialized form that is used, so a first run and a later one tokenize alike."""
    path = entry(gguf)
    try:
        return Tokenizer.from_str(path.read_text())
    except Exception:   # no entry, or one that cannot be read (tokenizers raises a bare Exception)
        pass
    text = build().to_str()
    paths.keep_in_cache(path, text)
    return Tokenizer.from_str(text)
