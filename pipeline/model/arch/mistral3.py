"""mistral3 (Ministral 3, Mistral Small 3.x text trunk): llama's layers with YaRN whose
attention factor is divided by 1 + 0.1 mscale_all_dim ln(factor) (`rope.scaling.yarn_log_mul`
holds mscale_all_dim itself), and the Llama-4 attention temperature: queries at position p are
multiplied by 1 + beta ln(floor(p / original context) + 1) (`attention.temperature_scale` is
beta)."""
from dataclasses import replace

from gguf import Keys

from ...errors import UserError
from .blocks import AttentionSpec, Temperature
from .llama import Llama
from .rope import YARN_DEFAULTS


class Mistral3(Llama):
    honours = frozenset({Keys.Attention.TEMPERATURE_SCALE, Keys.Rope.SCALING_YARN_LOG_MUL,
                         Keys.Rope.SCALING_YARN_BETA_FAST, Keys.Rope.SCALING_YARN_BETA_SLOW})

    def yarn_mscales(self) -> tuple[float, float]:
        return 1.0, float(self.key(Keys.Rope.SCALING_YARN_LOG_MUL, 0.0))

    def yarn_betas(self) -> dict[str, float]:
        # diff: the file's correction-dim betas (the others compute llama.cpp's defaults)
        return {field: float(self.key(key, YARN_DEFAULTS[key])) for field, key in
                (("beta_fast", Keys.Rope.SCALING_YARN_BETA_FAST), ("beta_slow", Keys.Rope.SCALING_YARN_BETA_SLOW))}

    def temperature(self) -> Temperature | None:
        beta = float(self.key(Keys.Attention.TEMPERATURE_SCALE, 0.0))
        if not beta:
            return None
        length = int(self.key(Keys.Rope.SCALING_ORIG_CTX_LEN, self.hp.context_length))
        if length <= 0:
            raise UserError(f"{self.gguf.path}: attention temperature needs a positive original context length")
        return Temperature(beta, length)

    def attention_spec(self, i: int) -> AttentionSpec:
        return replace(super().attention_spec(i), temperature=self.temperature())
