"""Tokenizer rebuilt from GGUF metadata with Hugging Face `tokenizers`.

The ids must equal llama.cpp's, so the pre-tokenizer follows llama.cpp's table of
`tokenizer.ggml.pre` regexes and the SentencePiece-style vocabulary ("llama" model) becomes a
byte-fallback BPE whose merge ranks follow the vocabulary scores, the order in which llama.cpp
merges. BOS is prepended only where the file says so.
"""
from dataclasses import dataclass

import numpy as np
from gguf import Keys, TokenType
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from ..errors import UserError
from .reader import GGUFIndex

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
          r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+"
           r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's forms of GPT-4o's and Tekken's case-splitting regexes: a letter not in a-z stands
# for an upper-case one, a letter not in A-Z for a lower-case one
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_CONTRACTION = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
_NOT_LN = r"[^\r\n\p{L}\p{N}]?"
_GPT4O = (f"{_NOT_LN}{_UPPER}*{_LOWER}+{_CONTRACTION}|{_NOT_LN}{_UPPER}+{_LOWER}*{_CONTRACTION}"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (f"{_NOT_LN}{_UPPER}*{_LOWER}+|{_NOT_LN}{_UPPER}+{_LOWER}*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+"
           r"|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi K2 as llama.cpp splits it (custom code, unicode.cpp): Han runs; words of letters other than
# Han, of any case (unlike the regex of K2's own tokenizer, which splits at case changes), with
# an optional contraction; digits in threes
_KIMI_K2 = (r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEEPSEEK3 = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
              r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
              r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]

# tokenizer.ggml.pre -> the regexes llama.cpp splits with, applied in turn (llama-vocab.cpp)
PRE_TOKENIZER_REGEXES = {
    "gpt-2": [_GPT2], "gpt2": [_GPT2], "mpt": [_GPT2], "olmo": [_GPT2], "jais": [_GPT2],
    "starcoder": [r"\p{N}", _GPT2], "refact": [r"\p{N}", _GPT2], "command-r": [r"\p{N}", _GPT2],
    "smollm": [r"\p{N}", _GPT2], "codeshell": [r"\p{N}", _GPT2], "exaone": [r"\p{N}", _GPT2],
    "qwen2": [_QWEN2], "stablelm2": [_QWEN2], "hunyuan": [_QWEN2],
    "llama3": [_LLAMA3], "llama-bpe": [_LLAMA3], "llama-v3": [_LLAMA3], "dbrx": [_LLAMA3],
    "smaug-bpe": [_LLAMA3], "falcon3": [_LLAMA3], "pixtral": [_LLAMA3],
    "glm4": [_LLAMA3], "glm5": [_LLAMA3],                                  # llama.cpp's CHATGLM4: llama3's regex
    "gpt-4o": [_GPT4O], "llama4": [_GPT4O], "minimax-m2": [_GPT4O],
    "tekken": [_TEKKEN], "deepseek-v3": _DEEPSEEK3, "qwen35": [_QWEN35], "kimi-k2": [_KIMI_K2],
}
IGNORE_MERGES = {"llama3", "llama-bpe", "llama-v3", "dbrx", "smaug-bpe", "falcon3", "pixtral", "glm4", "glm5", "tekken"}
NO_BOS = {"glm4", "glm5"}   # llama.cpp defines no BOS token for these
# BPE pre-tokenizers for which llama.cpp adds BOS where the file does not say (SentencePiece always does)
BOS_BY_DEFAULT = {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"}


@dataclass
class GGUFTokenizer:
    tokenizer: Tokenizer
    bos_id: int | None
    add_bos: bool

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise UserError("BOS was asked for but the model defines no BOS token")
            ids = [self.bos_id] + ids
        return ids


def load_tokenizer(gguf: GGUFIndex) -> GGUFTokenizer:
    kind = gguf.metadata.get(Keys.Tokenizer.MODEL)
    tokens = gguf.strings(Keys.Tokenizer.LIST)
    types = np.asarray(gguf.metadata.get(Keys.Tokenizer.TOKEN_TYPE, np.ones(len(tokens))))
    if kind == "gpt2":
        tok = _byte_level_bpe(gguf, tokens)
    elif kind == "llama":
        scores = np.asarray(gguf.metadata[Keys.Tokenizer.SCORES])
        add_space = bool(gguf.metadata.get(Keys.Tokenizer.ADD_PREFIX, True))
        tok = _sentencepiece_bpe(tokens, scores, types, add_space)
    else:
        raise UserError(f"tokenizer model {kind!r} is not supported (supported: gpt2, llama)")
    user_defined = [tokens[i] for i in np.flatnonzero(types == int(TokenType.USER_DEFINED))]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
    bos = gguf.metadata.get(Keys.Tokenizer.BOS_ID)
    pre = gguf.metadata.get(Keys.Tokenizer.PRE)
    add_bos = bool(gguf.metadata.get(Keys.Tokenizer.ADD_BOS, kind == "llama" or pre in BOS_BY_DEFAULT))
    if pre in NO_BOS:
        bos, add_bos = None, False
    return GGUFTokenizer(tok, None if bos is None else int(bos), add_bos)


def _byte_level_bpe(gguf: GGUFIndex, tokens: list[str]) -> Tokenizer:
    pre = str(gguf.metadata.get(Keys.Tokenizer.PRE, "default"))
    if pre not in PRE_TOKENIZER_REGEXES:
        raise UserError(f"BPE pre-tokenizer {pre!r} is not supported; "
                        f"known: {', '.join(sorted(PRE_TOKENIZER_REGEXES))}")
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in gguf.strings(Keys.Tokenizer.MERGES)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in IGNORE_MERGES))
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZER_REGEXES[pre]]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return tok


def _sentencepiece_bpe(tokens: list[str], scores: np.ndarray, types: np.ndarray, add_space: bool) -> Tokenizer:
    vocab = {t: i for i, t in enumerate(tokens)}
    kinds = np.isin(types, [int(TokenType.NORMAL), int(TokenType.USER_DEFINED)])
    score_of = scores.tolist()
    ranked = []
    for i in np.flatnonzero(kinds).tolist():
        piece = tokens[i]
        for k in range(1, len(piece)):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                ranked.append((-score_of[i], i, vocab[left], left, right))
    ranked.sort()
    merges = [(left, right) for *_, left, right in ranked]
    unknown = np.flatnonzero(types == int(TokenType.UNKNOWN))
    unk = tokens[unknown[0]] if unknown.size else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=unk, byte_fallback=True,
                               fuse_unk=True))
    steps = [normalizers.Prepend("▁")] if add_space else []
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = None
    return tok
