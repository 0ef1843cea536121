"""The order in which llama-perplexity takes the tasks of a HellaSwag or Winogrande file: each
draw picks one of the tasks left, `std::uniform_int_distribution<size_t>(0, left - 1)` over a
`std::mt19937` seeded 1, as libstdc++ computes it (Lemire's nearly-divisionless method on one
32-bit draw, a new draw while the low word falls under the threshold)."""
import numpy as np


def mt19937_draws(seed: int):
    """std::mt19937(seed)'s outputs: numpy's legacy RandomState seeds the same generator the
    same way, and a draw over [0, 2^32) takes one output whole (its stream is frozen)."""
    state = np.random.RandomState(seed)
    while True:
        yield int(state.randint(0, 1 << 32, dtype=np.uint64))


def llama_task_order(n_available: int, n_take: int) -> list[int]:
    """The file indices of the tasks llama-perplexity scores, in the order it scores them (n_take 0:
    all of them, in that order)."""
    draws, left, taken = mt19937_draws(1), list(range(n_available)), []
    for _ in range(min(n_take or n_available, n_available)):
        span = len(left)
        product = next(draws) * span
        if product & 0xFFFFFFFF < span:
            threshold = (1 << 32) % span        # -span % span in 32-bit arithmetic
            while product & 0xFFFFFFFF < threshold:
                product = next(draws) * span
        taken.append(left.pop(product >> 32))
    return taken


def llama_sampled_order(n_available: int, n_take: int) -> list[int]:
    """The file indices of the Winogrande or multiple-choice tasks llama-perplexity scores, in its
    order: all of them in file order unless fewer are asked for; then each draw takes
    j = int(float(draw / 2^32) * left) in float32 arithmetic, as its code does, and the last index
    left takes the chosen one's place."""
    import numpy as np

    if not 0 < n_take < n_available:
        return list(range(n_available))
    draws, left, taken = mt19937_draws(1), list(range(n_available)), []
    scale = np.float32(1) / (np.float32(1) + np.float32(0xFFFFFFFF))
    for _ in range(n_take):
        j = int(scale * np.float32(next(draws)) * np.float32(len(left)))
        taken.append(left[j])
        left[j] = left[-1]
        left.pop()
    return taken
