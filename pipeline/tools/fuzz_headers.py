"""Fuzzed GGUF headers: a real model's header changed at random, then opened as a run opens a model
before its first window. Every variant must be accepted or refused in one line (a UserError):
any other exception, a variant that runs past its time or one that asks for more memory than
the limit set here (8 GiB above what the process maps with the unchanged file open) is a
failure, printed with its number, the change and the traceback.

The header is walked here independently of the reader (pipeline/gguf_io/reader.py), field by
field: the counts, each metadata entry (its key's length and bytes, its type, its value: a
scalar, a string, an array's type, count and elements) and each tensor's entry (its name,
dimension count, dimensions, type and offset). A variant picks a field (from the counts one time
in five, else from a metadata entry or a tensor's entry) and sets it to an extreme (0, 1, 2^31 - 1,
2^32 - 1, 2^63 - 1, 2^64 - 1 and their neighbours) or to random bytes, or flips one of its bits;
one variant in twenty cuts the file inside its header instead.

    python -m pipeline.stress --headers 20000 [--seed 0]

runs it over the registered SmolLM2 model; tests/test_hostile_files.py runs 2,000 variants.
"""
import random
import resource
import shutil
import signal
import struct
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError

SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}   # GGUF value types
STRING, ARRAY = 8, 9
EXTREMES = (0, 1, 2, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1)
SECONDS_PER_VARIANT = 20


@dataclass(frozen=True)
class Field:
    offset: int
    size: int


def header_fields(data: bytes) -> tuple[list[list[Field]], int]:
    """The header's fields in groups (the counts; each metadata entry; each tensor's entry) and
    the byte where the header ends."""
    u32 = lambda at: struct.unpack_from("<I", data, at)[0]    # noqa: E731
    u64 = lambda at: struct.unpack_from("<Q", data, at)[0]    # noqa: E731
    n_tensors, n_kv = u64(8), u64(16)
    groups, pos = [[Field(0, 4), Field(4, 4), Field(8, 8), Field(16, 8)]], 24

    def string(at: int, into: list) -> int:
        into += [Field(at, 8), Field(at + 8, u64(at))] if u64(at) else [Field(at, 8)]
        return at + 8 + u64(at)

    def value(vtype: int, at: int, into: list) -> int:
        if vtype == STRING:
            return string(at, into)
        if vtype != ARRAY:
            into.append(Field(at, SCALAR_SIZES[vtype]))
            return at + SCALAR_SIZES[vtype]
        etype, count = u32(at), u64(at + 4)
        into += [Field(at, 4), Field(at + 4, 8)]
        at += 12
        elements = []
        for _ in range(count):
            at = value(etype, at, elements)
        into += elements[:32] + elements[-32:]         # a long array's first and last elements
        return at

    for _ in range(n_kv):
        entry = []
        pos = string(pos, entry)
        entry.append(Field(pos, 4))
        pos = value(u32(pos), pos + 4, entry)
        groups.append(entry)
    for _ in range(n_tensors):
        entry = []
        pos = string(pos, entry)
        n_dims = u32(pos)
        entry += [Field(pos, 4), *(Field(pos + 4 + 8 * d, 8) for d in range(n_dims)),
                  Field(pos + 4 + 8 * n_dims, 4), Field(pos + 8 + 8 * n_dims, 8)]
        pos += 4 + 8 * n_dims + 12
        groups.append(entry)
    return groups, pos


def mutation(rng: random.Random, groups: list[list[Field]], header_end: int, original: bytes) -> tuple[str, int, bytes]:
    """("patch", offset, the bytes written there) or ("cut", the size kept, b"")."""
    if rng.random() < 0.05:
        return "cut", rng.randrange(0, header_end + 64), b""
    f = rng.choice(groups[0] if rng.random() < 0.2 else rng.choice(groups[1:]))
    size, how = min(f.size, 8), rng.random()
    if how < 0.6 and size in (1, 2, 4, 8):
        value = rng.choice(EXTREMES) % (1 << 8 * size) if how < 0.3 else rng.getrandbits(8 * size)
        return "patch", f.offset, value.to_bytes(size, "little")
    at = f.offset + rng.randrange(size)          # one bit of the field flipped
    return "patch", at, bytes([original[at] ^ 1 << rng.randrange(8)])


def describe(change: tuple[str, int, bytes]) -> str:
    kind, at, data = change
    return f"cut at byte {at}" if kind == "cut" else f"{data.hex()} at byte {at}"


def open_as_a_run(path: Path, reference: dict) -> None:
    """What a run does with a model before its first window: the index, the family and its
    settings, the BOS rule, each layer's shapes and bytes, layer 0's weights, the head and the
    tokenizer; the last three only where what they read differs from the unchanged file's
    (`reference`: the fingerprints of the unchanged file, which is accepted; {}: all of them)."""
    import torch

    from ..gguf_io.reader import GGUFIndex
    from ..gguf_io.tokenizer import bos_rule, load_tokenizer
    from ..model.arch import load_architecture

    index = GGUFIndex(path)
    arch = load_architecture(index)
    bos_rule(index)
    for i in range(arch.hp.n_layers):
        arch.layer_shapes(i, torch.float32)
        sum(t.n_bytes for t in index.layer_tensors(i))
    prints = fingerprints(index)
    if prints["weights"] != reference.get("weights"):
        arch.load_layer(0, "cpu", torch.float32)
        arch.load_head("cpu", torch.float32)
    if prints["tokenizer"] != reference.get("tokenizer"):
        load_tokenizer(index).encode("The quick brown fox, 1234 times.", add_bos=True)


def fingerprints(index) -> dict:
    settings = index.fingerprint("", exclude=tuple(k for k in index.spans if k.startswith("tokenizer.")))
    return {"tokenizer": index.fingerprint("tokenizer."), "weights": hash((settings, tuple(index.tensors.values())))}


class Timeout(Exception):
    pass


def address_space() -> int:
    """This process's mapped bytes (VmSize)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    return 0


def fuzz(model: Path, variants: int, seed: int, work: Path, memory_limit: int = 8 << 30) -> dict:
    """Open `variants` changed copies of `model`'s header; returns the tally and the failures.
    Caps this process's address space at what it maps once the unchanged file is open, plus
    `memory_limit` bytes (run it in a process of its own)."""
    from ..gguf_io.reader import GGUFIndex

    original = model.read_bytes()
    groups, header_end = header_fields(original)
    target = work / "fuzzed.gguf"
    shutil.copyfile(model, target)
    reference = fingerprints(GGUFIndex(target))
    open_as_a_run(target, {})                      # every library loaded before the limit is counted
    limit = address_space() + memory_limit
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, lambda *_: (_ for _ in ()).throw(Timeout()))
    rng = random.Random(seed)
    tally, failures = {"variants": 0, "accepted": 0, "refused in one line": 0, "failed": 0}, []
    for k in range(variants):
        change = mutation(rng, groups, header_end, original)
        kind, at, data = change
        path = target
        if kind == "cut":
            path = work / "cut.gguf"
            path.write_bytes(original[:at])
        else:
            with open(target, "r+b") as f:
                f.seek(at)
                f.write(data)
        signal.alarm(SECONDS_PER_VARIANT)
        try:
            open_as_a_run(path, reference)
            tally["accepted"] += 1
        except UserError:
            tally["refused in one line"] += 1        # UserError shows one line, whatever a file holds
        except Timeout:
            failures.append((k, describe(change), f"ran past {SECONDS_PER_VARIANT} s"))
        except Exception:                        # noqa: BLE001 -- every other outcome is the failure counted
            failures.append((k, describe(change), traceback.format_exc(limit=6)))
        finally:
            signal.alarm(0)
            if kind == "patch":
                with open(target, "r+b") as f:
                    f.seek(at)
                    f.write(original[at:at + len(data)])
        tally["variants"] += 1
    tally["failed"] = len(failures)
    return {"tally": tally, "failures": failures}
