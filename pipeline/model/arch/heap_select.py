"""Which of equal scores ggml's top-k keeps, where the k-th best score is tied.

ggml_top_k on the CPU is libstdc++'s std::partial_sort over the indices, best first
(ggml-cpu/ops.cpp, cmp_top_k: a before b when score a > score b). Which tied indices end up in
the first k is whatever its heap selection leaves there: a heap of the first k, then each later
index that beats the heap's worst replacing it. This replays that selection step by step; torch's
topk keeps other ties. Only the set matters (the order is not used), and only where the k-th
score is tied, which the caller finds first.
"""


def heap_select(scores: list[float], k: int) -> list[int]:
    """The k indices std::partial_sort(idx, idx + k, idx + n, by descending score) leaves first."""
    heap = list(range(k))

    def before(a: int, b: int) -> bool:        # cmp_top_k: a sorts before b
        return scores[a] > scores[b]

    def adjust(hole: int, value: int) -> None:  # std::__adjust_heap, then std::__push_heap
        top, child = hole, hole
        while child < (k - 1) // 2:
            child = 2 * (child + 1)
            if before(heap[child], heap[child - 1]):
                child -= 1
            heap[hole] = heap[child]
            hole = child
        if k % 2 == 0 and child == (k - 2) // 2:
            child = 2 * (child + 1)
            heap[hole] = heap[child - 1]
            hole = child - 1
        parent = (hole - 1) // 2
        while hole > top and before(heap[parent], value):
            heap[hole] = heap[parent]
            hole, parent = parent, (parent - 1) // 2
        heap[hole] = value

    if k >= 2:                                  # std::__make_heap
        for parent in range((k - 2) // 2, -1, -1):
            adjust(parent, heap[parent])
    for i in range(k, len(scores)):             # std::__heap_select
        if before(i, heap[0]):
            adjust(0, i)                        # std::__pop_heap: i's index in, the worst out
    return heap
