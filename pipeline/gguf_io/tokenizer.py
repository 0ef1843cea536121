"""Tokenizer rebuilt from GGUF metadata with Hugging Face `tokenizers`.

The ids must equal llama.cpp's, so the pre-tokenizer follows llama.cpp's table of
`tokenizer.ggml.pre` values (pre_tokenizers.py), Gemma 4's vocabulary ("gemma4" model) is a BPE
over raw UTF-8 with spaces as ▁, and the SentencePiece-style vocabulary ("llama" model) becomes
a byte-fallback BPE whose merge ranks follow the vocabulary scores, the order in which llama.cpp
merges. BOS and EOS are added as llama.cpp adds them: where the file says so, or by the
pre-tokenizer's default.
"""
from dataclasses import dataclass

import numpy as np
from gguf import Keys, TokenType
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

from ..errors import UserError
from .pre_tokenizers import PreTokenizer, pre_tokenizer
from .reader import GGUFIndex


@dataclass
class GGUFTokenizer:
    tokenizer: Tokenizer
    bos_id: int | None
    add_bos: bool
    eos_id: int | None = None
    add_eos: bool = False

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise UserError("BOS was asked for but the model defines no BOS token")
            ids = [self.bos_id] + ids
        if self.add_eos:
            ids.append(self.eos_id)
        return ids


def load_tokenizer(gguf: GGUFIndex) -> GGUFTokenizer:
    """The file's tokenizer: a BPE vocabulary's built from the file, a SentencePiece one's built
    once and read back after (tokenizer_cache.py)."""
    from .tokenizer_cache import cached

    pre = file_pre_tokenizer(gguf)          # an unsupported tokenizer refused before any cache is read
    tok = build_tokenizer(gguf, pre) if pre is not None else cached(gguf, lambda: build_tokenizer(gguf, pre))
    eos = gguf.metadata.get(Keys.Tokenizer.EOS_ID)
    add_eos = bool(gguf.metadata.get(Keys.Tokenizer.ADD_EOS, False)) and eos is not None
    return GGUFTokenizer(tok, *bos_rule(gguf), None if eos is None else int(eos), add_eos)


def build_tokenizer(gguf: GGUFIndex, pre: PreTokenizer | None) -> Tokenizer:
    tokens = gguf.strings(Keys.Tokenizer.LIST)
    types = np.asarray(gguf.metadata.get(Keys.Tokenizer.TOKEN_TYPE, np.ones(len(tokens))))
    if pre is not None:
        tok = _bpe(gguf, tokens, pre)
    else:
        scores = np.asarray(gguf.metadata[Keys.Tokenizer.SCORES])
        add_space = bool(gguf.metadata.get(Keys.Tokenizer.ADD_PREFIX, True))
        tok = _sentencepiece_bpe(tokens, scores, types, add_space)
    user_defined = [tokens[i] for i in np.flatnonzero(types == int(TokenType.USER_DEFINED))]
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user_defined])
    return tok


BPE_MODELS = ("gpt2", "gemma4")


def file_pre_tokenizer(gguf: GGUFIndex) -> PreTokenizer | None:
    """The BPE pre-tokenizer of the file's tokenizer (llama.cpp reads a missing value as
    `default`; Gemma 4's vocabulary has its own), None for a SentencePiece one."""
    kind = gguf.metadata.get(Keys.Tokenizer.MODEL)
    if kind == "llama":
        return None
    if kind not in BPE_MODELS:
        raise UserError(f"tokenizer model {kind!r} is not supported (supported: gpt2, gemma4, llama)")
    return pre_tokenizer("gemma4" if kind == "gemma4" else str(gguf.metadata.get(Keys.Tokenizer.PRE) or "default"))


def bos_rule(gguf: GGUFIndex) -> tuple[int | None, bool]:
    """(the BOS id, whether it is added) as llama-vocab.cpp decides: the file's add_bos_token,
    else the tokenizer's default (SentencePiece and some pre-tokenizers add one); Gemma 4's
    always; no BOS at all where the pre-tokenizer defines none (ChatGLM, GLM). A tokenizer not
    rebuilt here (its ids given by --tokens-file) follows the file's keys alone."""
    bos = gguf.metadata.get(Keys.Tokenizer.BOS_ID)
    bos = None if bos is None else int(bos)
    try:
        pre = file_pre_tokenizer(gguf)
    except UserError:
        return bos, bool(gguf.metadata.get(Keys.Tokenizer.ADD_BOS, False))
    add_bos = bool(gguf.metadata.get(Keys.Tokenizer.ADD_BOS, pre is None or pre.bos_by_default))
    if pre is not None and pre.no_bos:
        return None, False
    return bos, add_bos or (pre is not None and pre.forced_bos)


def _bpe(gguf: GGUFIndex, tokens: list[str], pre: PreTokenizer) -> Tokenizer:
    """A BPE over GPT-2's byte alphabet, or (Gemma 4) over raw UTF-8 with spaces as ▁ and
    unknown characters as <0xXX> byte tokens."""
    vocab = {t: i for i, t in enumerate(tokens)}
    # split at the first space after the first character, as llama.cpp reads a merge
    merges = [(m[:i], m[i + 1:]) for m in gguf.strings(Keys.Tokenizer.MERGES) if (i := m.find(" ", 1)) > 0]
    try:
        model = models.BPE(vocab=vocab, merges=merges, ignore_merges=pre.ignore_merges,
                           byte_fallback=not pre.byte_level)
    except Exception as e:   # tokenizers raises its own Exception naming the token
        raise UserError(f"{gguf.path}: the tokenizer's merges do not fit its vocabulary ({e})") from None
    tok = Tokenizer(model)
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
    if pre.byte_level:
        splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    else:
        tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
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
