"""Everything a run's numbers depend on, resolved once from the user's options.

Model alias -> verified file and its identity (read in milliseconds: gguf_io/identity.py);
evaluation task + overrides -> scoring method; corpus -> sha256; tokenizer -> fingerprint of its
GGUF metadata (so quantizations of one model share their tokenization). These identities feed
the output-path hashes of the Luigi tasks.
"""
import functools
import hashlib
from dataclasses import dataclass
from pathlib import Path

from gguf import Keys

from ..errors import UserError
from ..gguf_io.reader import GGUFIndex, open_gguf
from ..gguf_io.registry import file_sha256, resolve_model
from ..gguf_io.tokenizer import bos_rule
from .corpus_plan import Method
from .evaltask import EvalTask, corpus_text, load_eval_task, text_sha256


@dataclass(frozen=True)
class RunSpec:
    model_path: Path
    model_id: str
    eval_task: EvalTask
    corpus: str          # --corpus PATH, or "" for the task's own source
    tokens_file: str     # pre-tokenized input, replacing corpus + tokenizer
    method: Method
    escape: bool = False  # escape sequences in the text processed, as llama-perplexity -e does

    @property
    def gguf(self) -> GGUFIndex:
        return open_gguf(str(self.model_path))

    @functools.cached_property
    def corpus_id(self) -> dict:
        if self.tokens_file:
            return {"tokens_file": self.tokens_file, "sha256": file_sha256(Path(self.tokens_file))}
        from .modes import BY_METHOD

        mode = BY_METHOD[self.method.name]
        if getattr(mode, "binary", False):
            content, label = mode().content(self.eval_task, self.corpus)
            return {"source": label, "sha256": hashlib.sha256(content).hexdigest()}
        text, label = corpus_text(self.eval_task, self.corpus)
        return {"source": label, "sha256": text_sha256(text)} | ({"escapes": "processed"} if self.escape else {})

    @functools.cached_property
    def tokenizer_id(self) -> str:
        if self.tokens_file:
            return "tokens-file"
        return self.gguf.fingerprint("tokenizer.", exclude=(Keys.Tokenizer.CHAT_TEMPLATE,))

    @property
    def bos_id(self) -> int | None:
        return bos_rule(self.gguf)[0]


@functools.lru_cache(maxsize=16)
def resolve_run(model: str, task: str, corpus: str, tokens_file: str, method: str, ctx: int,
                stride: int, unscored_prefix: int, chunks: int, bos: str, hellaswag: str = "",
                hellaswag_tasks: int = 400, winogrande: str = "", winogrande_tasks: int = 0,
                multiple_choice: str = "", multiple_choice_tasks: int = 0, escape: bool = False) -> RunSpec:
    from .modes import CHOICE_METHODS

    eval_task = load_eval_task(task)
    path = resolve_model(model)
    gguf = open_gguf(str(path))
    defaults = eval_task.method
    files = {"hellaswag": (hellaswag, hellaswag_tasks), "winogrande": (winogrande, winogrande_tasks),
             "multiple-choice": (multiple_choice, multiple_choice_tasks)}
    given = [name for name, (file, _) in files.items() if file]
    if len(given) > 1:
        raise UserError(f"--{given[0]} and --{given[1]} are two runs: give one")
    if given:                          # llama-perplexity's options: the mode and its file at once
        if method not in ("", given[0]):
            raise UserError(f"--{given[0]} scores a task file; it takes no --method {method}")
        method, corpus = given[0], files[given[0]][0]
    name = method or defaults.get("name", "llama-cpp")
    if name in CHOICE_METHODS:
        if chunks >= 0:
            raise UserError(f"--chunks counts a corpus's sequences; {name} takes --{name}-tasks N")
        if tokens_file:
            raise UserError(f"--tokens-file gives a corpus's ids; {name} tokenizes its own tasks")
        chunks = files[name][1]
        if chunks < 0:
            raise UserError(f"--{name}-tasks must be >= 0 (0: all), got {chunks}")
    bos_id, add_bos = bos_rule(gguf)   # as llama-perplexity tokenizes and marks each chunk
    add_bos = {"auto": add_bos, "yes": True, "no": False}[bos]
    from ..model.arch import load_architecture

    context = load_architecture(gguf).hp.context_length
    if name in CHOICE_METHODS and not ctx:   # the tasks set the context
        from .modes import BY_METHOD
        from .modes.choice import row_width

        ctx = row_width(BY_METHOD[name], str(path), *BY_METHOD[name]().content(eval_task, corpus, escape),
                        chunks, add_bos, context)
    m = Method(name=name, ctx=ctx or int(defaults.get("ctx", 512)),
               stride=stride, unscored_prefix=unscored_prefix,
               chunks=int(defaults.get("chunks", 0)) if chunks < 0 else chunks, bos=add_bos)
    if m.ctx > context:
        raise UserError(f"--ctx {m.ctx} is above the model's context length of {context}")
    if m.bos and bos_id is None:
        raise UserError("--bos yes was asked for but the model defines no BOS token")
    if escape and (tokens_file or name in ("stride", "multiple-choice")):
        what = "--tokens-file" if tokens_file else f"the {name} method, which reads its file as it is"
        raise UserError(f"--escape applies to a text read as llama-perplexity reads -f (the llama-cpp, hellaswag "
                        f"and winogrande methods), not to {what}")
    return RunSpec(path, gguf.identity.model_id, eval_task, corpus, tokens_file, m, escape)
