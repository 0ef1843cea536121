"""Which of equal scores ggml's top-k keeps, where the k-th best score is tied.

ggml_top_k on the CPU is libstdc++'s std::partial_sort over the indices, best first
(ggml-cpu/ops.cpp, cmp_top_k: a before b when score a > score b). Which tied indices end up in
the first k is whatever its heap selection leaves there: a heap of the first k, then each later
index that beats the heap's worst replacing it. This replays that selection step by step (compiled
by numba: a sparse attention replays it for every query of a long row); torch's topk keeps other
ties. Only the set matters (the order is not used). The families import this module when they
select (importing numba costs a process about 0.2 s).
"""
import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def heap_select_into(scores: np.ndarray, k: int, heap: np.ndarray) -> None:
    """The k indices std::partial_sort(idx, idx + k, idx + n, by descending score) leaves first,
    written into heap[:k] (scores [n], n >= k)."""
    for j in range(k):
        heap[j] = j

    def adjust(hole, value):                    # std::__adjust_heap, then std::__push_heap
        top, child = hole, hole
        while child < (k - 1) // 2:
            child = 2 * (child + 1)
            if scores[heap[child]] > scores[heap[child - 1]]:
                child -= 1
            heap[hole] = heap[child]
            hole = child
        if k % 2 == 0 and child == (k - 2) // 2:
            child = 2 * (child + 1)
            heap[hole] = heap[child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and scores[heap[parent]] > scores[value]:
            heap[hole] = heap[parent]
            hole, parent = parent, (parent - 1) // 2
        heap[hole] = value

    if k >= 2:                                  # std::__make_heap
        for parent in range((k - 2) // 2, -1, -1):
            adjust(parent, heap[parent])
    for i in range(k, len(scores)):             # std::__heap_select
        if scores[i] > scores[heap[0]]:
            adjust(0, i)                        # std::__pop_heap: i's index in, the worst out


def heap_select(scores, k: int) -> list[int]:
    """The k indices of `scores` (a sequence of n >= k floats) that ggml's top-k keeps."""
    heap = np.empty(k, dtype=np.int64)
    heap_select_into(np.asarray(scores, dtype=np.float64), k, heap)
    return heap.tolist()


@numba.njit(cache=True, nogil=True)
def select_top_k(scores: np.ndarray, lengths: np.ndarray, k: int, selected: np.ndarray) -> None:
    """Per row r of scores [R, n]: of its first lengths[r] entries, the k that ggml's top-k keeps
    (all of them where there are no more), marked in selected [R, n] (zeros in)."""
    heap = np.empty(k, dtype=np.int64)
    for r in range(scores.shape[0]):
        m = lengths[r]
        if m <= k:
            selected[r, :m] = True
            continue
        heap_select_into(scores[r, :m], k, heap)
        for j in heap:
            selected[r, j] = True


TAIL = 1e9   # llama.cpp's score of a tail key: finite, above every block's


@numba.njit(cache=True, nogil=True)
def select_keys(block_scores: np.ndarray, ratio: int, width: int, selected: np.ndarray) -> None:
    """Query-sparse attention's keys: block_scores [R, T, blocks] of every query t of R rows ->
    selected [R, T, T] (zeros in, True where kept): the keys of t's incomplete tail block, then of
    llama.cpp's top `width` scores over t's keys, each key scored as its block (qwen4exp.py; ggml's
    heap selection picks among equal scores)."""
    R, T, _ = block_scores.shape
    row = np.empty(T, dtype=np.float32)
    heap = np.empty(width, dtype=np.int64)
    for r in range(R):
        for t in range(T):
            if t < width:
                selected[r, t, :t + 1] = True
                continue
            tail = (t + 1) // ratio * ratio
            for j in range(tail):
                row[j] = block_scores[r, t, j // ratio]
            row[tail:t + 1] = TAIL
            heap_select_into(row[:t + 1], width, heap)
            for j in heap:
                selected[r, t, j] = True
