"""Tokenizers built once: a file's tokenizer is rebuilt from its metadata at its first use (2 s
for Gemma-3's 262k-entry vocabulary), then read back from its serialized form in data/tokenizers/.
The entry is named by the sha256 of what the build reads
(the vocabulary, merges, scores and types as stored, the tokenizer model, the pre-tokenizer chosen)
and of the code that builds it, so another vocabulary, pre-tokenizer or build never reads an entry
made for something else."""
import functools
import hashlib
import os
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
STORED = (Keys.Tokenizer.LIST, Keys.Tokenizer.MERGES, Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE)
READ = (Keys.Tokenizer.MODEL, Keys.Tokenizer.ADD_PREFIX)


def entry(gguf: GGUFIndex, pre) -> Path:
    """The cache entry of gguf's tokenizer built with the pre-tokenizer `pre` (None: SentencePiece)."""
    chosen = [repr(gguf.metadata.get(k)) for k in READ] + [repr(pre)]
    key = hashlib.sha256("|".join([gguf.entries_sha256(STORED), *chosen, code_sha256()]).encode()).hexdigest()
    return paths.TOKENIZERS_CACHE / f"{key}.json"


def cached(gguf: GGUFIndex, pre, build: Callable[[], Tokenizer]) -> Tokenizer:
    """The tokenizer build() makes for gguf with the pre-tokenizer `pre`, read from its entry where
    one was written. It is always the serialized form that is used, so a first run and a later one
    tokenize alike."""
    path = entry(gguf, pre)
    try:
        return Tokenizer.from_str(path.read_text())
    except Exception:   # no entry, or one that cannot be read (tokenizers raises a bare Exception)
        pass
    text = build().to_str()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.replace(path)                      # whole or absent, whoever writes it
    except OSError:
        pass                                   # a read-only cache only costs a rebuild next time
    return Tokenizer.from_str(text)
