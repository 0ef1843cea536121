"""One allocation for the dequantized weights of a layer window, taken over by the next
window of the same size.

A window's weights are views of one block (on the CPU a mapping of its own, outside the C
heap), not one allocation each. Released, the block is kept: the windows of a pass mostly
hold as many weights as each other, and the next one dequantizes into pages that are already
there instead of page-faulting its weights anew (4 float32 layers of Qwen2.5-0.5B: 240 MB; of
a 7B model: 3 GB). Any task but a window drops it (flow/output_task.py), so it is never held beside
memory it does not serve. On a GPU each window's memory is released before the next.
"""
import math
import mmap

import torch

ALIGN = 64  # bytes: every tensor starts on a cache line


def tensor_bytes(arch, info, dtype: torch.dtype) -> int:
    """Bytes of a GGUF tensor (a TensorInfo) dequantized for compute in `dtype`, in the dtype the
    family `arch` holds it in."""
    return math.prod(info.shape) * arch.held_dtype(info.name, dtype).itemsize


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def block_bytes(arch, i: int, dtype: torch.dtype, expert_slices: int = 1) -> int:
    """What block `i` takes of a window's weight block: each tensor, cache-line aligned; with
    `expert_slices` > 1 its routed experts (where it has any) count as one slice's scratch."""
    from .arch.experts import expert_tensor_names

    gguf = arch.gguf
    sliced = set(expert_tensor_names(gguf, i).values()) if expert_slices > 1 else set()
    held = sum(_aligned(tensor_bytes(arch, t, dtype)) for t in gguf.layer_tensors(i) if t.name not in sliced)
    if not sliced:
        return held
    per = -(-gguf.tensors[next(iter(sliced))].shape[0] // expert_slices)
    return held + sum(_aligned(per * math.prod(gguf.tensors[n].shape[1:]) * arch.held_dtype(n, dtype).itemsize)
                      for n in sliced)


class WeightBlock:
    def __init__(self, nbytes: int, device):
        self.mapping = None
        if torch.device(device).type == "cpu" and nbytes:
            # a mapping of its own, outside the C heap
            self.mapping = mmap.mmap(-1, nbytes)
            self.data = torch.frombuffer(self.mapping, dtype=torch.uint8)  # [nbytes]
        else:
            self.data = torch.empty(nbytes, dtype=torch.uint8, device=device)
        self.nbytes, self.used = nbytes, 0   # the bytes this window holds in it, of them taken

    @classmethod
    def for_layers(cls, arch, first: int, last: int, dtype: torch.dtype, device,
                   expert_slices: int = 1) -> "WeightBlock":
        """Room for every tensor of blocks [first, last) of the family `arch`, dequantized for
        compute in `dtype`; with `expert_slices` > 1, for one slice of each layer's routed experts
        instead of all of them."""
        return cls.reused(sum(block_bytes(arch, i, dtype, expert_slices) for i in range(first, last)), device)

    @classmethod
    def reused(cls, nbytes: int, device) -> "WeightBlock":
        """The block the last window kept, where it has room for `nbytes` on this device (its
        pages already faulted in: a hybrid's windows differ in size; the pages past `nbytes`
        given back); else a new one."""
        global _kept
        block, _kept = _kept, None
        if block is not None and block.data.device == torch.device(device) and (
                block.data.numel() == nbytes or (block.data.numel() > nbytes and hasattr(mmap, "MADV_REMOVE"))):
            block.hold(nbytes)
            return block
        del block  # freed before the new one is allocated
        return cls(nbytes, device)

    def hold(self, nbytes: int) -> None:
        """From now on the block holds `nbytes`: the pages past them are freed (a smaller window
        after a bigger one holds what its plan counted, no more), to be faulted in again, as
        zeros, by a bigger window later."""
        start = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        if start < self.data.numel():
            self.mapping.madvise(mmap.MADV_REMOVE, start, self.data.numel() - start)
        self.nbytes, self.used = nbytes, 0

    def keep(self) -> None:
        """Leave the block, whose tensors are no longer used, to the next window (on the CPU;
        on a GPU each window's memory is released before the next)."""
        global _kept
        if self.data.device.type == "cpu":
            _kept = self

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """An uninitialised tensor inside the block; None when it has no room left (a tensor
        read in another dtype than the block was sized for)."""
        n = math.prod(shape) * dtype.itemsize
        if self.used + n > self.nbytes:
            return None
        view = self.data[self.used:self.used + n].view(dtype).view(shape)
        self.used += _aligned(n)
        return view


_kept: WeightBlock | None = None


def drop_kept() -> None:
    global _kept
    _kept = None
