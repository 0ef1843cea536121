"""The lean GGUF index agrees with gguf-py's GGUFReader and rejects damaged files clearly."""
import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from pipeline.errors import UserError
from pipeline.gguf_io.reader import GGUFIndex, StringArray


def test_index_matches_gguf_reader(model_path):
    path = model_path("smollm2-135m")
    ours, ref = GGUFIndex(path), GGUFReader(path)
    assert set(ours.tensors) == {t.name for t in ref.tensors}
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.qtype == t.tensor_type
        assert info.offset == int(t.data_offset)
        np.testing.assert_array_equal(ours.raw(t.name).reshape(-1).view(np.uint8),
                                      np.asarray(t.data).reshape(-1).view(np.uint8))
    for key, field in ref.fields.items():
        if key.startswith("GGUF."):
            continue
        value = ours.metadata[key]
        if isinstance(value, StringArray):
            assert ours.strings(key) == field.contents()
        elif field.types[0] == GGUFValueType.ARRAY:
            np.testing.assert_array_equal(value, field.contents())
        else:
            assert value == pytest.approx(field.contents())


def test_truncated_file_is_a_user_error(model_path, tmp_path):
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(model_path("smollm2-135m").read_bytes()[:5_000_000])
    with pytest.raises(UserError, match="truncated"):
        GGUFIndex(cut)


def test_not_gguf_is_a_user_error(tmp_path):
    bogus = tmp_path / "model.gguf"
    bogus.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(UserError, match="not a GGUF file"):
        GGUFIndex(bogus)


def test_real_tensors_dequantize_like_gguf(model_path):
    """Every tensor type the real models use, one tensor each, against gguf-py."""
    from gguf import quants

    from pipeline.gguf_io.dequant import dequantize

    for alias in ("smollm2-135m", "gemma3-270m", "qwen2.5-0.5b"):
        index = GGUFIndex(model_path(alias))
        seen = {}
        for name, info in index.tensors.items():
            seen.setdefault(info.qtype, name)
        for qtype, name in seen.items():
            raw = index.raw(name)[:64]
            ours = dequantize(raw, qtype).numpy()
            ref = quants.dequantize(np.asarray(raw), qtype)
            np.testing.assert_array_equal(ours.view(np.uint32), np.asarray(ref, np.float32).view(np.uint32),
                                          err_msg=f"{alias} {name} {qtype.name}")
