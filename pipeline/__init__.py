"""layercycle: perplexity of GGUF models larger than the device, one layer window at a time.

`luigi --module pipeline PerplexityRun` imports this package; importing it registers the tasks.
"""
from .flow.tasks import Embed, LayerWindow, PerplexityRun, Score, Sweep, Tokenize

__all__ = ["Tokenize", "Embed", "LayerWindow", "Score", "PerplexityRun", "Sweep"]
