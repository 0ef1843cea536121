"""llama.cpp's `tokenizer.ggml.pre` values, as llama-vocab.cpp of the llama.cpp that
llama-cpp-python 0.3.36 vendors reads them: the regexes each splits text with (applied in turn,
each over the pieces of the last), and its BPE rules.

llama.cpp runs a regex that names a Unicode category through std::regex over a "collapsed" text,
every code point above 127 replaced by one byte for its category: there `\\p{Lu}`, `\\p{Ll}`,
`\\p{Lt}`, `\\p{Lm}` and `\\p{Lo}` each stand for any letter, so they are written `\\p{L}` here.
Its hand-written splitters (Kimi K2's, AFMoE's digits) are written as the regexes they implement;
a zero-width split (SuperBPE's digits) as the pieces it leaves; `$` as `\\z`, the end of a piece.
"""
from dataclasses import dataclass

from ..errors import UserError


@dataclass(frozen=True)
class PreTokenizer:
    regexes: tuple[str, ...]
    ignore_merges: bool = False    # a word the vocabulary holds whole is one token
    bos_by_default: bool = False   # BOS added where the file does not say (tokenizer.ggml.add_bos_token)
    no_bos: bool = False           # llama.cpp defines no BOS token
    byte_level: bool = True        # GPT-2's byte alphabet; False: raw UTF-8, spaces as ▁, bytes as <0xXX>
    forced_bos: bool = False       # BOS added whatever the file says (Gemma 4)


_C = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"   # contractions, either case
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN2 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + _TAIL
_LLAMA3 = _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|" + _TAIL
_QWEN35 = _C + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# GPT-4o's and Tekken's case-splitting regexes as llama.cpp writes them: a letter not in a-z
# stands for an upper-case one, a letter not in A-Z for a lower-case one
_UPPER, _LOWER = r"((?=[\p{L}])([^a-z]))", r"((?=[\p{L}])([^A-Z]))"
_NOT_LN = r"[^\r\n\p{L}\p{N}]?"
_SLASH_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_GPT4O = (f"{_NOT_LN}{_UPPER}*{_LOWER}+{_C}?|{_NOT_LN}{_UPPER}+{_LOWER}*{_C}?|" r"\p{N}{1,3}|" + _SLASH_TAIL)
_TEKKEN = f"{_NOT_LN}{_UPPER}*{_LOWER}+|{_NOT_LN}{_UPPER}+{_LOWER}*|" r"\p{N}|" + _SLASH_TAIL
_UPPER_M, _LOWER_M = r"((?=[\p{L}\p{M}])([^a-z]))", r"((?=[\p{L}\p{M}])([^A-Z]))"
_GRANITE_MULTI = (f"{_NOT_LN}{_UPPER_M}*{_LOWER_M}+{_C}?|{_NOT_LN}{_UPPER_M}+{_LOWER_M}*{_C}?|" r"\p{N}{1,3}|"
                  + _SLASH_TAIL)
# the cased regex of Tiny Aya and Youtu, its letter classes collapsed as llama.cpp runs them
_CASED = f"{_NOT_LN}[\\p{{L}}\\p{{M}}]*[\\p{{L}}\\p{{M}}]+{_C}?|{_NOT_LN}[\\p{{L}}\\p{{M}}]+[\\p{{L}}\\p{{M}}]*{_C}?|"
_DIGITS_FROM_RIGHT = r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))"   # 1234567 -> 1 234 567
_CJK_KANA = "[一-龥\u3040-ゟ゠-ヿ]+"
_PUNCT_WORDS = r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
_DEEPSEEK3 = (r"\p{N}{1,3}", _CJK_KANA, _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Kimi K2 as llama.cpp splits it (unicode.cpp): Han runs; words of letters other than Han, of
# any case, with an optional contraction; digits in threes
_KIMI_K2 = (r"\p{Han}+|[^\r\n\p{L}\p{N}]?[\p{L}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}|" + _TAIL)
_BLOOM = r" ?[^(\s|.,!?…。，、।۔،)]+"
_NEWLINES = r"[^\n]+|[\n]+"
_HANGUL_CJK = "[一-龥ࠀ-一가-\ud7ff]+"
_DEEPSEEK_LLM_LETTERS = r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+"  # noqa: E501 (llama.cpp's character class as it stands)

GPT2 = PreTokenizer((_GPT2,))
DIGITS_APART = PreTokenizer((r"\p{N}", _GPT2))
QWEN2 = PreTokenizer((_QWEN2,))
LLAMA3 = PreTokenizer((_LLAMA3,), ignore_merges=True, bos_by_default=True)
GPT4O = PreTokenizer((_GPT4O,))
DEEPSEEK3 = PreTokenizer(_DEEPSEEK3)
BLOOM = PreTokenizer((_BLOOM,))
BAILINGMOE = PreTokenizer((r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+",))
TINY_AYA = PreTokenizer((_DIGITS_FROM_RIGHT, _CASED + r"\p{N}{1,3}|" + _SLASH_TAIL))
GEMMA4 = PreTokenizer((_NEWLINES,), byte_level=False, forced_bos=True)


def _names(names: str, pre: PreTokenizer) -> dict[str, PreTokenizer]:
    return dict.fromkeys(names.split(), pre)


PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]")),
    "minicpm5": PreTokenizer((r"\p{N}{1,3}", _C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+|" + _TAIL), ignore_merges=True),
    **_names("llama3 llama-v3 llama-bpe falcon3 falcon-h1 pixtral midm-2.0 lfm2 jina-v5-nano", LLAMA3),
    "deepseek-llm": PreTokenizer((r"[\r\n]", _DEEPSEEK_LLM_LETTERS, r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+\z",
                                  _HANGUL_CJK, r"\p{N}+")),
    "deepseek-coder": PreTokenizer((r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _HANGUL_CJK, r"\p{N}")),
    **_names("deepseek-v3 hunyuan-dense hy_v4 joyai-llm", DEEPSEEK3),
    "spark2_5": PreTokenizer((r"\p{N}{1,3}", _CJK_KANA,
                              _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+|[\r\n]|\s+(?!\S)|\s+", r"\p{N}")),
    "youtu": PreTokenizer(("[가-힣ㄱ-ㆎ]+|[！…“”‘’—：；，、-〿︰-﹏]+|[ㄅ-ㄯ]+|[一-龥\u3040-ゟ゠-ヿ]+",
                           _CASED + r"\p{N}|" + _SLASH_TAIL), ignore_merges=True),
    "falcon": PreTokenizer((r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")),
    **_names("gpt-2 phi-2 jina-es jina-de gigachat jina-v2-es jina-v2-de a.x-4.0 mellum modern-bert jina-v1-en "
             "jina-v2-code roberta-bpe mpt olmo jais trillion granite-docling exaone4", GPT2),
    **_names("starcoder refact command-r smollm codeshell exaone minerva-7b mellum2", DIGITS_APART),
    "jais-2": PreTokenizer((_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|"
                            + "|".join(rf"\s{{{n}}}(?!\S)" for n in (512, 256, 128, 64, 32, 16, 8, 4))
                            + r"|\s{1,2}(?!\S)|\s{1}",)),
    **_names("gemma4 granite-embed-multi-311m", GEMMA4),
    "sarvam-moe": PreTokenizer((_NEWLINES,), byte_level=False),
    **_names("qwen2 deepseek-r1-qwen kormo f2llmv2 megrez stablelm2 hunyuan solar-open grok-2", QWEN2),
    "qwen35": PreTokenizer((_QWEN35,)),
    **_names("dbrx smaug-bpe", PreTokenizer((_LLAMA3,))),
    **_names("poro-chat bloom gpt3-finnish", BLOOM),
    "chatglm-bpe": PreTokenizer((_LLAMA3,), no_bos=True),
    **_names("glm4 glm5", PreTokenizer((_LLAMA3,), ignore_merges=True, no_bos=True)),
    "viking": PreTokenizer((_BLOOM, r"\p{N}")),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, bos_by_default=True),
    "exaone-moe": PreTokenizer((_C + r"|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+|\p{N}"
                                r"| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",)),
    "chameleon": PreTokenizer(("<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\t\n]|    |  )",
                               r"\p{N}", r"[\p{P}!-/:-@\[-`{-~]", _GPT2), bos_by_default=True),
    **_names("gpt-4o llama4 kanana2 talkie minimax-m2", GPT4O),
    "granite-embed-multi-97m": PreTokenizer((_GRANITE_MULTI,), ignore_merges=True),
    **_names("tiny_aya cohere2moe", TINY_AYA),
    "superbpe": PreTokenizer((r"\p{N}+", "[0-9]{1,3}(?=(?:[0-9]{3})*(?![0-9]))")),
    **_names("bailingmoe bailingmoe2 llada-moe", BAILINGMOE),
    "seed-coder": PreTokenizer((_C + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+"
                                r"|\s+(?!\S)|\s+",)),
    "kimi-k2": PreTokenizer((_KIMI_K2,)),
    "ufakzeka": PreTokenizer((r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|" + _TAIL,)),
    "afmoe": PreTokenizer((_DIGITS_FROM_RIGHT, "[一-鿿㐀-䶿豈-\ufaff\u3040-ゟ゠-ヿ･-ﾟ⼀-\u2fdfเ-\u0e7f\u0e80-\u0effក-\u17ffက-႟ꩠ-ꩿꧠ-\ua9ff가-\ud7afᄀ-ᇿ]+",  # noqa: E501 (llama.cpp's character class as it stands)
                           _PUNCT_WORDS + r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")),
    "laguna": PreTokenizer((_NEWLINES, _QWEN2)),
}
# llama.cpp's `whitespace` belongs to an embedding model's tokenizer (tokenizer model
# `whitespace`, its own session): not a language model's, not computed here
NOT_COMPUTED = {"whitespace": "an embedding model's pre-tokenizer"}


def pre_tokenizer(name: str) -> PreTokenizer:
    if name in PRE_TOKENIZERS:
        return PRE_TOKENIZERS[name]
    why = NOT_COMPUTED.get(name, "not one that llama.cpp knows")
    raise UserError(f"BPE pre-tokenizer {name!r} is not supported ({why}); known: {', '.join(sorted(PRE_TOKENIZERS))}")
