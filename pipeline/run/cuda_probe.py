"""What the CUDA device offers (free and total memory, bfloat16 support), asked once per process in a
short child process: the process that schedules the tasks never initialises CUDA itself, since
Luigi forks a process per task with --workers > 1 and a child of a process that has
initialised CUDA cannot use it."""
import functools
import json
import subprocess
import sys

from ..errors import UserError

PROBE = ("import json, torch; "
         "free, total = torch.cuda.mem_get_info(); "
         "print(json.dumps({'free': free, 'total': total, 'bf16': torch.cuda.is_bf16_supported()}))")


def cuda_facts() -> dict:
    """{"free": bytes free on the current CUDA device, "total": its memory, "bf16": whether it
    computes in bfloat16}."""
    facts = _probe()
    if isinstance(facts, str):
        raise UserError(f"the CUDA device could not be queried: {facts}")
    return facts


def absent() -> str | None:
    """Why no CUDA device can be used here, or None where one can: a torch built without CUDA
    answers at once, any other is asked in the child process."""
    import torch

    if not torch.backends.cuda.is_built():
        return "this torch was built without CUDA"
    facts = _probe()
    return facts if isinstance(facts, str) else None


@functools.cache
def _probe() -> dict | str:
    """The child process's answer, or its last line of error (kept too: asked once either way)."""
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        return (done.stderr.strip().splitlines() or ["no output"])[-1]
    return json.loads(lines[-1])
