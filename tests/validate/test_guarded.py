"""``qckpt validate`` keeps the registry's safety net: only ConverterError escapes a reader, its
loader, a detector or a validation hook, wherever validate calls them (registry.read / guarded)."""

from dataclasses import replace

import pytest

from converter.errors import ConverterError, MalformedInputError
from converter.formats import registry
from converter.formats.source import Source
from converter.scheme import ZeroPoint
from converter.validate import validate
from converter.validate.probes import probe_tensor, run_probe
from tests.conftest import SAMPLES

GPTQ = SAMPLES / "gptq_w4_g128_sym"
QUERY = "encoder.layer.0.attention.self.query.weight"


def _patch(monkeypatch, name, **changes):
    monkeypatch.setitem(registry._REGISTRY, name, replace(registry.get(name), **changes))


@pytest.mark.malformed_ok
def test_reader_foreign_exception_becomes_a_finding_not_a_traceback(monkeypatch):
    def bad_read(src):
        raise IndexError("list index out of range")
    _patch(monkeypatch, "gptq", read=bad_read)
    rep = validate(GPTQ)
    assert rep.exit_code == 1 and len(rep.findings) == 1
    assert "IndexError" in rep.findings[0].message and "gptq reader" in rep.findings[0].message


@pytest.mark.malformed_ok
def test_loader_foreign_exception_becomes_a_finding(monkeypatch):
    real = registry.get("gptq").read

    def read(src):
        ck = real(src)
        inner = ck._loader

        def load(name):
            if name == QUERY:
                raise KeyError("qzeros")
            return inner(name)
        ck._loader = load
        return ck
    _patch(monkeypatch, "gptq", read=read)
    rep = validate(GPTQ)
    hits = [f for f in rep.findings if f.tensor == QUERY]
    assert hits and "KeyError" in hits[0].message and rep.exit_code == 1


@pytest.mark.malformed_ok
def test_detector_foreign_exception_is_a_converter_error(monkeypatch):
    def bad_detect(src):
        raise TypeError("unhashable type")
    _patch(monkeypatch, "gptq", detect=bad_detect)
    with pytest.raises(MalformedInputError, match="format detection"):
        validate(GPTQ)


@pytest.mark.malformed_ok
def test_hook_foreign_exception_does_not_escape(monkeypatch):
    hooks = registry.get("gptq").validation
    _patch(monkeypatch, "gptq", validation=replace(hooks, zero_convention=lambda s, sp: [][1]))
    rep = validate(GPTQ)
    assert rep.exit_code == 0  # the hook's evidence is simply missing


@pytest.mark.malformed_ok
def test_probe_with_a_reader_raising_foreign_exceptions_reports_an_error(tmp_path):
    h = registry.get("gptq")

    def bad_read(src):
        raise ValueError("cannot reshape array")
    res = run_probe(replace(h, read=bad_read), probe_tensor(13, 40, 16, 4, False, ZeroPoint.NONE), tmp_path)
    assert not res.passed and "ValueError" in res.error


def test_registry_read_guards_read_and_loader():
    ck = registry.read(Source(GPTQ), "gptq")
    assert ck.format == "gptq" and ck[QUERY].shape == (384, 384)
    with pytest.raises(ConverterError):
        registry.read(Source(GPTQ), "no-such-format")
