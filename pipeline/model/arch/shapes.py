"""The tensors against what the metadata says, checked when an architecture is loaded, before
any work: the vocabulary, the blocks present, heads x head sizes against every attention
projection (fused or not), the feed-forward and expert widths. One line names the first tensor
that disagrees."""
from gguf import MODEL_TENSOR, TENSOR_NAMES, Keys

from ...errors import UserError
from .blocks import AttentionSpec

MT = MODEL_TENSOR


def qkv_rows(spec: AttentionSpec) -> list[int]:
    """Rows of the Q (with its gate), K and V projections, in that order in a fused attn_qkv."""
    return [spec.n_head * (spec.key_dim + (spec.value_dim if spec.gated else 0)), spec.n_kv * spec.key_dim,
            spec.n_kv * spec.value_dim]


def check_shapes(arch) -> None:
    """What the metadata says against the tensors' shapes, before any work: the vocabulary,
    the blocks present, heads x head sizes and the feed-forward widths, one line naming the
    first tensor that disagrees."""
    t, hp = arch.gguf.tensors, arch.hp
    tokens = arch.gguf.metadata.get(Keys.Tokenizer.LIST)
    vocab = tokens.count if tokens is not None else t[TENSOR_NAMES[MT.TOKEN_EMBD] + ".weight"].shape[0]
    for key in (Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE):
        if key in arch.gguf.metadata and len(arch.gguf.metadata[key]) != vocab:
            raise UserError(f"{arch.gguf.path}: {key} has {len(arch.gguf.metadata[key])} entries for "
                            f"{vocab} tokens")
    expect(arch, TENSOR_NAMES[MT.TOKEN_EMBD] + ".weight", (vocab, hp.hidden), "tokens x embedding_length",
           required=True)
    expect(arch, TENSOR_NAMES[MT.OUTPUT] + ".weight", (vocab, hp.hidden), "tokens x embedding_length")
    expect(arch, *arch.output_norm_shape(), required=True)
    blocks = arch.gguf.blocks()
    total = int(arch.key(Keys.LLM.BLOCK_COUNT))
    computing = {spec.index for spec in arch.specs if spec.mixer or spec.ffn}   # a layer of neither holds no tensor
    if blocks - set(range(total)) or computing - blocks:
        odd = min((blocks - set(range(total))) or (computing - blocks))
        raise UserError(f"{arch.gguf.path}: block_count is {total} but block {odd} "
                        f"{'has tensors' if odd >= total else 'has none'}")
    for spec in arch.specs:
        expect_layer(arch, spec)


def expect(arch, name: str, shape: tuple[int, ...], why: str, required: bool = False,
           unit_axes: bool = False) -> None:
    """`name` has `shape` (`unit_axes`: once the axes of size 1 are left out of both, for a tensor
    that llama.cpp takes in several such layouts)."""
    def kept(dims: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(d for d in dims if d != 1) if unit_axes else tuple(dims)

    info = arch.gguf.tensors.get(name)
    if info is None and required:
        raise UserError(f"{arch.gguf.path}: missing tensor {name}")
    if info is not None and kept(info.shape) != kept(shape):
        raise UserError(f"{arch.gguf.path}: tensor {name} is {list(info.shape)} where the metadata gives "
                        f"{list(shape)} ({why})")


def expect_layer(arch, spec) -> None:
    """Attention and feed-forward tensors of one layer against its spec (a recurrent mixer's
    or latent attention's own tensors are checked by its family)."""
    hidden = arch.hp.hidden

    def name(kind: MODEL_TENSOR, suffix: str = "weight") -> str:
        return f"{TENSOR_NAMES[kind].format(bid=spec.index)}.{suffix}"

    a = spec.attention
    if spec.mixer in ("attention", "attention+mamba2"):
        if a.n_head <= 0 or a.n_kv <= 0 or a.n_head % a.n_kv or a.key_dim <= 0 or a.value_dim <= 0:
            raise UserError(f"{arch.gguf.path}: layer {spec.index} has {a.n_head} heads, {a.n_kv} KV heads, "
                            f"head sizes {a.key_dim} / {a.value_dim}: not an attention layer")
        q_rows, k_rows, v_rows = qkv_rows(a)
        fused = name(MT.ATTN_QKV) in arch.gguf.tensors
        expect(arch, name(MT.ATTN_QKV), (q_rows + k_rows + v_rows, hidden), "Q, K and V rows x embedding_length")
        expect(arch, name(MT.ATTN_QKV, "bias"), (q_rows + k_rows + v_rows,), "Q, K and V rows")
        for kind, rows, why in ((MT.ATTN_Q, q_rows, "head_count x key_length" + (" + gate" if a.gated else "")),
                                (MT.ATTN_K, k_rows, "head_count_kv x key_length"),
                                (MT.ATTN_V, v_rows, "head_count_kv x value_length")):
            expect(arch, name(kind), (rows, hidden), why + " x embedding_length",
                   required=not fused and kind in arch.own_projections(spec.index))
            expect(arch, name(kind, "bias"), (rows,), why)
        expect(arch, name(MT.ATTN_OUT), (hidden, a.n_head * a.value_dim), "embedding_length x heads x value_length",
               required=True)
        q_norm, k_norm = arch.qk_norm_shapes(a)
        expect(arch, name(MT.ATTN_Q_NORM), q_norm, "the family's QK-norm of head_count x key_length",
               required=a.qk_norm_across_heads)
        expect(arch, name(MT.ATTN_K_NORM), k_norm, "the family's QK-norm of head_count_kv x key_length",
               required=a.qk_norm_across_heads)
        expect(arch, name(MT.ATTN_SINKS), (a.n_head,), "head_count")
    if spec.ffn == "mlp":
        ff = arch.gguf.tensors[name(MT.FFN_UP)].shape[0] if name(MT.FFN_UP) in arch.gguf.tensors else 0
        rows, why = ff, "feed-forward width x embedding_length"
        if arch.fused_gate_up_mlp:   # ffn_up holds the gate's rows, then the up projection's
            ff = ff // 2
            rows, why = 2 * ff, "the gate's and the up projection's rows, 2 x feed-forward width"
        expect(arch, name(MT.FFN_UP), (rows, hidden), why, required=True)
        expect(arch, name(MT.FFN_GATE), (ff, hidden), "the up projection's shape")
        expect(arch, name(MT.FFN_DOWN), (hidden, ff), "the up projection's, transposed", required=True)
    elif spec.ffn == "moe":
        n_expert = int(arch.key(Keys.LLM.EXPERT_COUNT))
        down = arch.gguf.tensors.get(name(MT.FFN_DOWN_EXP))
        ff = down.shape[2] if down is not None and len(down.shape) == 3 else 0
        fused = arch.fused_gate_up_experts and name(MT.FFN_GATE_UP_EXP) in arch.gguf.tensors
        width = arch.expert_width()   # the experts' input and output (embedding_length but in a latent MoE)
        expect(arch, name(MT.FFN_GATE_INP), (n_expert, hidden), "expert_count x embedding_length", required=True)
        expect(arch, name(MT.FFN_GATE_UP_EXP), (n_expert, 2 * ff, width), "gate and up of expert_count experts")
        expect(arch, name(MT.FFN_UP_EXP), (n_expert, ff, width), "expert_count experts", required=not fused)
        expect(arch, name(MT.FFN_GATE_EXP), (n_expert, ff, width), "the up projections' shape")
        expect(arch, name(MT.FFN_DOWN_EXP), (n_expert, width, ff), "the up projections', transposed", required=True)
        expect(arch, name(MT.FFN_GATE_INP, "bias"), (n_expert,), "expert_count")
        shared = arch.gguf.arch_value(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH)
        if shared is not None:
            for kind in (MT.FFN_UP_SHEXP, MT.FFN_GATE_SHEXP):
                expect(arch, name(kind), (int(shared), hidden), "expert_shared_feed_forward_length x embedding_length")
        for kind, rows in ((MT.FFN_UP_EXP, ff), (MT.FFN_GATE_EXP, ff), (MT.FFN_DOWN_EXP, width)):
            expect(arch, name(kind, "bias"), (n_expert, rows), "expert_count x the projection's rows")
