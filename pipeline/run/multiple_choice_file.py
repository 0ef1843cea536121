"""llama.cpp's binary multiple-choice task file (`llama-perplexity --multiple-choice -bf FILE`), read
and written: uint32 task count, a uint32 offset of each task, then each task: the question, the
single-answer set (uint32 count, the answers, an int32 label each, 1 for right) and a
multiple-answer set in the same layout (not scored, as llama-perplexity scores none). Strings
are a uint32 length and that many UTF-8 bytes."""
import struct

from ..errors import UserError

MAX_ANSWERS = 100          # llama-perplexity refuses a set with more


def read_tasks(data: bytes, source: str) -> list[tuple[str, list[str], list[int]]]:
    """(question, answers, labels) of each task of llama.cpp's binary multiple-choice file."""
    def fail(what: str):
        raise UserError(f"{source}: {what}; a multiple-choice file is llama.cpp's binary layout "
                        f"(pass it as llama-perplexity's -bf file)")

    def u32(at: int) -> tuple[int, int]:
        if at + 4 > len(data):
            fail(f"ends at byte {len(data)}, inside a task")
        return struct.unpack_from("<I", data, at)[0], at + 4

    def string(at: int) -> tuple[str, int]:
        size, at = u32(at)
        if at + size > len(data):
            fail(f"a string of {size} bytes at byte {at} runs past the end")
        try:
            return data[at:at + size].decode("utf-8"), at + size
        except UnicodeDecodeError:
            fail(f"the string at byte {at} is not UTF-8")

    def answers(at: int) -> tuple[list[str], list[int], int]:
        n, at = u32(at)
        if n > MAX_ANSWERS:
            fail(f"a task with {n} answers (at most {MAX_ANSWERS})")
        texts = []
        for _ in range(n):
            text, at = string(at)
            texts.append(text)
        if at + 4 * n > len(data):
            fail("a task's labels run past the end")
        return texts, list(struct.unpack_from(f"<{n}i", data, at)), at + 4 * n

    n_task, at = u32(0)
    if n_task == 0:
        fail("no tasks")
    if 4 + 4 * n_task > len(data):
        fail(f"{n_task} task offsets do not fit in {len(data)} bytes")
    tasks = []
    for t, pos in enumerate(struct.unpack_from(f"<{n_task}I", data, 4)):
        question, at = string(pos)
        texts, labels, at = answers(at)
        answers(at)                                   # the multiple-answer set: read, not scored
        if not question or not texts or not all(texts):
            fail(f"task {t} has an empty question or answer")
        tasks.append((question, texts, labels))
    return tasks


def write_tasks(tasks: list[tuple[str, list[str], list[int]]]) -> bytes:
    """llama.cpp's binary multiple-choice file of (question, answers, labels) tasks, with an empty
    multiple-answer set each."""
    def string(text: str) -> bytes:
        raw = text.encode("utf-8")
        return struct.pack("<I", len(raw)) + raw

    bodies = [string(q) + struct.pack("<I", len(a)) + b"".join(map(string, a)) + struct.pack(f"<{len(a)}i", *labels)
              + struct.pack("<I", 0) for q, a, labels in tasks]
    offsets, at = [], 4 + 4 * len(tasks)
    for body in bodies:
        offsets.append(at)
        at += len(body)
    return struct.pack(f"<I{len(tasks)}I", len(tasks), *offsets) + b"".join(bodies)
