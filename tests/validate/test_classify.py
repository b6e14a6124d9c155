"""Reader errors become finding codes by their type, kind and field, never by their wording."""

import pytest

from converter.errors import ErrorKind, FormatError, LayoutError, MissingTensorError
from converter.validate.reader_errors import KIND_CODES, classify


@pytest.mark.parametrize("kind, code", [(ErrorKind.CONFIG_MISMATCH, "config-mismatch"), (ErrorKind.SHAPE, "shape"),
                                        (ErrorKind.ZERO_POINT_RANGE, "zero-range")])
def test_kind_decides(kind, code):
    assert classify(FormatError("anything", field="values", kind=kind)) == code


def test_every_kind_has_a_code():
    assert set(KIND_CODES) == set(ErrorKind)


def test_wording_is_ignored():
    exc = FormatError("the config says actorder but the shape is out of range", field="values",
                      hint="the config contradicts the tensors")
    assert classify(exc) == "format"


def test_type_and_field_rules():
    assert classify(MissingTensorError("absent", field="scales", kind=ErrorKind.SHAPE)) == "missing-tensor"
    assert classify(LayoutError("bad", field="codes")) == "code-range"
    assert classify(FormatError("bad", field="g_idx")) == "g-idx"
    assert classify(FormatError("bad", field="scales.dtype")) == "dtype"
    assert classify(FormatError("bad", field="quantization_config.bits")) == "config-mismatch"
    assert classify(FormatError("bad", field="shape[1]")) == "shape"


def test_kind_is_not_rendered():
    assert FormatError("m", field="f", kind=ErrorKind.SHAPE).render() == FormatError("m", field="f").render()
