"""ernie4_5-moe (ERNIE 4.5 MoE): llama's attention and dense layers; past the leading dense
blocks, every `interleave_moe_layer_step`-th layer is a mixture of experts routed by softmax
with a selection bias (renormalised top-k), beside shared experts where the file has them."""
from gguf import Keys

from .llama import Llama


class Ernie45Moe(Llama):
    honours = frozenset({Keys.LLM.LEADING_DENSE_BLOCK_COUNT})

    def ffn_kind(self, i: int) -> str:
        lead = int(self.key(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, 0))
        step = int(self.key(Keys.LLM.INTERLEAVE_MOE_LAYER_STEP))
        return "moe" if i >= lead and step > 0 and (i + 1) % step == 0 else "mlp"
