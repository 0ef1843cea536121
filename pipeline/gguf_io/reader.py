"""GGUF metadata and lazy, memory-mapped tensors.

gguf-py's GGUFReader turns every tokenizer entry into numpy objects when it opens a file
(seconds and hundreds of MB for a 262k vocabulary). A window task needs a few scalars and its
own layers' bytes, so this index reads the header once, skips string arrays until they are
asked for, and maps tensor data straight from the file. Type codes and sizes come from gguf-py,
and from ggml_types.py for the types ggml has that the installed gguf-py lacks.

A model published in parts (`NAME-00001-of-00009.gguf`, as llama.cpp's gguf-split and gguf-py's
writer name them) is one index over every part: metadata from the first, tensors from all, the
parts checked as llama.cpp's loader checks them.
"""
import dataclasses
import functools
import hashlib
import math
import mmap
import re
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFValueType, Keys

from ..errors import UserError
from .ggml_types import QUANT_SIZES, GGMLType, ggml_type
from .page_reader import PAGE_READER

GGUF_MAGIC = 0x46554747  # b"GGUF" read as little-endian uint32
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4             # GGML_MAX_DIMS
MAX_NAME = 64            # GGML_MAX_NAME: a tensor's name and its terminating zero
U64 = struct.Struct("<Q")
SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>[0-9]{5})-of-(?P<count>[0-9]{5})\.gguf")

_SCALAR = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    qtype: GGMLType
    shape: tuple[int, ...]  # numpy order: (..., rows, row_length)
    offset: int             # absolute byte offset in its file
    n_bytes: int
    part: int = 0           # which file of a split model holds it


@dataclass(frozen=True)
class StringArray:
    """A string array left unparsed: `GGUFIndex.strings(key)` reads it on demand."""
    offset: int
    count: int


class GGUFFile:
    """One file's header: its metadata, where each entry's bytes lie, and its tensors."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read GGUF file {self.path}: {e}") from None
        try:
            self._parse()
        except (struct.error, ValueError, IndexError) as e:
            raise UserError(f"{self.path} is truncated or not a valid GGUF file ({e})") from None

    # -- parsing ---------------------------------------------------------------------------
    def _parse(self) -> None:
        """The header, checked as it is read: counts the file could hold, no name twice, a
        power-of-two alignment, tensor dimensions and offsets the format allows."""
        m = self.map
        if len(m) < 24 or struct.unpack_from("<I", m, 0)[0] != GGUF_MAGIC:
            raise UserError(f"{self.path} is not a GGUF file (bad magic)")
        self.version, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
        if self.version not in (2, 3):
            raise UserError(f"{self.path}: unsupported GGUF version {self.version}")
        # a key takes at least 12 bytes, a tensor's entry at least 24: a count beyond is a damaged header
        if n_kv * 12 + n_tensors * 24 > len(m):
            raise UserError(f"{self.path}: the header claims {n_kv} metadata keys and {n_tensors} tensors, more "
                            f"than the file's {len(m)} bytes hold; the file is damaged")
        pos = 24
        self.metadata: dict[str, object] = {}
        self.spans: dict[str, tuple[int, int]] = {}  # key -> its bytes in the file
        for _ in range(n_kv):
            start = pos
            key, pos = self._string(pos)
            if key in self.metadata:
                raise UserError(f"{self.path}: metadata key {key} appears twice")
            (vtype,), pos = struct.unpack_from("<I", m, pos), pos + 4
            self.metadata[key], pos = self._value(GGUFValueType(vtype), pos)
            self.spans[key] = (start, pos)
        infos = {}
        for _ in range(n_tensors):
            name, pos = self._string(pos)
            if len(name.encode()) >= MAX_NAME:
                raise UserError(f"{self.path}: tensor {len(infos)} has a name of {len(name.encode())} bytes "
                                f"(GGUF allows fewer than {MAX_NAME})")
            if name in infos:
                raise UserError(f"{self.path}: tensor {name} appears twice")
            (n_dims,), pos = struct.unpack_from("<I", m, pos), pos + 4
            if not 1 <= n_dims <= MAX_DIMS:
                raise UserError(f"{self.path}: tensor {name} has {n_dims} dimensions (GGUF allows 1 to {MAX_DIMS})")
            dims = struct.unpack_from(f"<{n_dims}Q", m, pos)
            pos += 8 * n_dims
            qtype, rel = struct.unpack_from("<IQ", m, pos)
            pos += 12
            infos[name] = (dims, qtype, rel)
        align = self.metadata.get(Keys.General.ALIGNMENT, DEFAULT_ALIGNMENT)
        if not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise UserError(f"{self.path}: {Keys.General.ALIGNMENT} = {align} is not a power of two")
        data_start = (pos + align - 1) // align * align
        self.header_bytes = pos   # metadata and tensor infos: what the file says of itself
        self.tensors: dict[str, TensorInfo] = {}
        for name, (dims, qtype, rel) in infos.items():
            if rel % align:
                raise UserError(f"{self.path}: tensor {name} starts at offset {rel}, not a multiple of the "
                                f"file's alignment {align}")
            self.tensors[name] = self._tensor_info(name, dims, qtype, data_start + rel)

    def _tensor_info(self, name: str, dims, qtype: int, offset: int) -> TensorInfo:
        try:
            qtype = ggml_type(qtype)
        except ValueError:
            raise UserError(f"{self.path}: tensor {name} has unknown GGML type {qtype}") from None
        block, type_size = QUANT_SIZES[qtype]
        if min(dims) < 1 or dims[0] % block:
            raise UserError(f"{self.path}: tensor {name} has dimensions {list(dims)}, which {qtype.name} cannot hold "
                            f"(every dimension at least 1, rows a multiple of {block})")
        n_bytes = math.prod(dims) // block * type_size
        if offset + n_bytes > len(self.map):
            raise UserError(f"{self.path} is truncated: tensor {name} ends past the end of the file")
        return TensorInfo(name, qtype, tuple(int(d) for d in reversed(dims)), offset, n_bytes)

    def _string(self, pos: int) -> tuple[str, int]:
        (n,) = struct.unpack_from("<Q", self.map, pos)
        end = pos + 8 + n
        if end > len(self.map):
            raise ValueError("string runs past the end of the file")
        return self.map[pos + 8:end].decode("utf-8", errors="replace"), end

    def _value(self, vtype: GGUFValueType, pos: int):
        if vtype == GGUFValueType.STRING:
            return self._string(pos)
        if vtype == GGUFValueType.ARRAY:
            etype, count = struct.unpack_from("<IQ", self.map, pos)
            etype, pos = GGUFValueType(etype), pos + 12
            if etype == GGUFValueType.STRING:
                if count * 8 > len(self.map) - pos:
                    raise ValueError(f"a string array of {count} entries runs past the end of the file")
                start, size, length = pos, len(self.map), U64.unpack_from
                for _ in range(count):
                    pos += 8 + length(self.map, pos)[0]
                    if pos > size:
                        raise ValueError(f"a string of the array at byte {start} runs past the end of the file")
                return StringArray(start, count), pos
            if etype == GGUFValueType.ARRAY:
                raise ValueError("nested arrays are not used by any model key")
            dtype = np.dtype(_SCALAR[etype])
            arr = np.frombuffer(self.map, dtype=dtype, count=count, offset=pos)
            return arr, pos + count * dtype.itemsize
        fmt = _SCALAR[vtype]
        return struct.unpack_from(fmt, self.map, pos)[0], pos + struct.calcsize(fmt)


class GGUFIndex:
    """A model's GGUF: one file, or every part of a split one (metadata from the first part)."""

    def __init__(self, path: Path):
        files = split_parts(GGUFFile(Path(path)))
        first = files[0]
        self.path, self.parts = first.path, [f.path for f in files]
        self.version, self.metadata, self.spans, self._map = first.version, first.metadata, first.spans, first.map
        self._maps = [f.map for f in files]
        self.header_bytes = [f.header_bytes for f in files]
        self.forget_used = False   # a tensor's pages dropped from the page cache once it is dequantized
        self.tensors: dict[str, TensorInfo] = {}
        for part, f in enumerate(files):
            for name, info in f.tensors.items():
                if name in self.tensors:
                    raise UserError(f"tensor {name} is in both {self.parts[self.tensors[name].part]} and {f.path}: "
                                    f"a part of another split model")
                self.tensors[name] = dataclasses.replace(info, part=part)
        if len(files) > 1:
            claimed = int(first.metadata.get(Keys.Split.LLM_KV_SPLIT_TENSORS_COUNT, -1))
            if claimed != len(self.tensors):
                raise UserError(f"{first.path} says its {len(files)} parts hold {claimed} tensors; they hold "
                                f"{len(self.tensors)}: a part of another split model")

    @functools.cached_property
    def identity(self):
        """Its identity, and the sha256 of its tensors as a pass reads them (identity.py)."""
        from .identity import FileIdentity

        return FileIdentity(self)

    def header(self, part: int) -> memoryview:
        """Part `part`'s header bytes: its metadata and tensor infos."""
        return memoryview(self._maps[part])[:self.header_bytes[part]]

    @property
    def n_bytes(self) -> int:
        """The model's size on disk, every part together."""
        return sum(len(m) for m in self._maps)

    # -- access ----------------------------------------------------------------------------
    @property
    def architecture(self) -> str:
        return str(self.metadata.get(Keys.General.ARCHITECTURE, ""))

    def arch_value(self, key_template: str, default=None):
        """A `{arch}`-templated key from gguf.Keys.LLM / Keys.Attention / Keys.Rope."""
        return self.metadata.get(key_template.format(arch=self.architecture), default)

    def strings(self, key: str) -> list[str]:
        ref = self.metadata[key]
        assert isinstance(ref, StringArray), key
        m, length = self._map, struct.Struct("<Q").unpack_from   # a tight loop: 150k+ entries
        out, pos = [], ref.offset
        for _ in range(ref.count):
            (n,) = length(m, pos)
            out.append(m[pos + 8:pos + 8 + n].decode("utf-8", errors="replace"))
            pos += 8 + n
        if pos > len(m):
            raise UserError(f"{self.path}: string array {key} runs past the end of the file")
        return out

    def fingerprint(self, prefix: str, exclude: tuple[str, ...] = ()) -> str:
        """sha256 of the stored bytes of every metadata entry under `prefix`."""
        return self.entries_sha256(sorted(k for k in self.spans if k.startswith(prefix) and k not in exclude))

    def entries_sha256(self, keys) -> str:
        """sha256 of the stored bytes (key, type and value) of the metadata entries `keys` the file has."""
        h = hashlib.sha256()
        for key in keys:
            if key in self.spans:
                start, end = self.spans[key]
                h.update(self._map[start:end])
        return h.hexdigest()

    def blocks(self) -> set[int]:
        """The block numbers its tensors name (`blk.N.*`)."""
        return {int(n.split(".")[1]) for n in self.tensors if n.startswith("blk.") and n.split(".")[1].isdigit()}

    def layer_tensors(self, i: int) -> list[TensorInfo]:
        """The tensors of block `i` (`blk.{i}.*`)."""
        prefix = f"blk.{i}."
        return [t for n, t in self.tensors.items() if n.startswith(prefix)]

    def release_pages(self, name: str) -> None:
        """Drop the pages of tensor `name` from this process's resident set once it has been
        dequantized: RSS then holds the tensor being read, not every tensor of the window or
        the file. They stay in the page cache unless `forget_used` is set."""
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        info = self.tensors[name]
        start = info.offset - info.offset % mmap.PAGESIZE
        self._maps[info.part].madvise(mmap.MADV_DONTNEED, start, info.offset + info.n_bytes - start)
        if self.forget_used:
            PAGE_READER.forget(self.parts[info.part], start, info.offset + info.n_bytes)

    def read_ahead(self, names, limit: int) -> None:
        """Read these tensors' pages into the page cache in the background (at most `limit`
        bytes of them, the first in file order; page_reader.py): a window's bytes come off the
        disk ahead of its dequantization, the next window's while this one computes."""
        ranges: dict[int, list[tuple[int, int]]] = {}
        for name in names:
            info = self.tensors[name]
            ranges.setdefault(info.part, []).append((info.offset, info.offset + info.n_bytes))
        for part, spans in sorted(ranges.items()):
            limit -= PAGE_READER.read(self.parts[part], spans, limit)

    def raw(self, name: str) -> np.ndarray:
        """The tensor's bytes as uint8 of shape (..., rows, row_bytes), mapped, read-only."""
        info = self.tensors[name]
        data = np.frombuffer(self._maps[info.part], dtype=np.uint8, count=info.n_bytes, offset=info.offset)
        block, type_size = QUANT_SIZES[info.qtype]
        return data.reshape(*info.shape[:-1], info.shape[-1] // block * type_size)



def split_parts(given: GGUFFile) -> list[GGUFFile]:
    """Every part of the split model `given` belongs to ([given] for a whole file), in order,
    each checked: its file there, its split.no and split.count those of its name, and no other
    file beside them named as one of its parts."""
    count = int(given.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT, 1))
    if count <= 1:
        return [given]
    named = SPLIT_NAME.fullmatch(given.path.name)
    if not named:
        no = int(given.metadata.get(Keys.Split.LLM_KV_SPLIT_NO, 0))
        raise UserError(f"{given.path} is part {no + 1} of {count} of a split GGUF but is not named "
                        f"NAME-{no + 1:05d}-of-{count:05d}.gguf, so its other parts cannot be found")
    count = int(named["count"])
    paths = [given.path.with_name(split_name(named["prefix"], i + 1, count)) for i in range(count)]
    for other in sorted(given.path.parent.iterdir()):
        match = SPLIT_NAME.fullmatch(other.name)
        if match and match["prefix"] == named["prefix"] and int(match["count"]) == count and other not in paths:
            raise UserError(f"{other} is not one of the {count} parts of {paths[0].name}: an extra part")
    files = []
    for i, path in enumerate(paths):
        if not path.is_file():
            raise UserError(f"part {i + 1} of {count} of {paths[0].name} is missing: {path}")
        part = given if path == given.path else GGUFFile(path)
        no, of = part.metadata.get(Keys.Split.LLM_KV_SPLIT_NO), part.metadata.get(Keys.Split.LLM_KV_SPLIT_COUNT)
        if (no, of) != (i, count):
            said = "is not a part of a split GGUF" if of is None else f"says it is part {no + 1} of {of}"
            raise UserError(f"{path} {said}, where part {i + 1} of {count} belongs: a reordered or foreign part")
        files.append(part)
    return files


def split_name(prefix: str, no: int, count: int) -> str:
    return f"{prefix}-{no:05d}-of-{count:05d}.gguf"


def first_split_part(prefix: Path) -> Path | None:
    """The first part of the split model `prefix` names (`NAME` for `NAME-00001-of-0000N.gguf`),
    or None where there is none; more than one such set is refused."""
    if not prefix.parent.is_dir():
        return None
    firsts = sorted(p for p in prefix.parent.iterdir()
                    if (m := SPLIT_NAME.fullmatch(p.name)) and m["prefix"] == prefix.name and m["no"] == "00001")
    if len(firsts) > 1:
        raise UserError(f"{prefix} names {len(firsts)} split models ({', '.join(p.name for p in firsts)}): "
                        f"give the first part of one")
    return firsts[0] if firsts else None


@functools.lru_cache(maxsize=4)
def open_gguf(path: str) -> GGUFIndex:
    return GGUFIndex(Path(path))
