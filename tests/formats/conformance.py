"""The conformance every readable and writable format passes; each format's tests subclass it.

A subclass names its format (``FORMAT``) and the real samples whose decode the producing tool
recorded (``SAMPLES``: a checkpoint and its ``reference_dequant.safetensors``) and, where the
tool's decode has its own operation order, overrides :meth:`decode_like_tool`. The base class then
checks, with the format's own writer and reader (``converter.formats.registry``):

- round trip: every probe tensor the format accepts (``converter.validate.probes``: 13 rows, a
  prime count, and a partial final group where the format allows one; schemes from 4-bit
  symmetric to float bias, act-order) is written and read back with identical codes, scales and a
  bit-identical decode;
- axis probe: no alternative interpretation (transposed, other nibble order, wrong groups ...)
  reproduces the decode (``run_probe``);
- the real samples decode like their tool, bit for bit in the reference's dtype;
- hostile inputs: a written output truncated, or its config replaced by a JSON list, raises a
  :class:`~converter.errors.ConverterError` subclass (never another exception) on read or load.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from converter.errors import ConverterError
from converter.formats import registry
from converter.formats.source import Source
from converter.quant.recode import as_unsigned
from converter.tensor import Checkpoint, QuantizedTensor
from converter.validate.probes import PROBE_CONFIG, _candidates, probe_tensors, run_probe


def _bits(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    return a.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[a.dtype.itemsize])


class FormatConformance:
    """Subclass with ``FORMAT = "<registered name>"``; a format that writes quantized tensors also
    subclasses :class:`QuantizedFormatConformance`, one with tool-decoded samples
    :class:`ToolDecodeConformance` (``SAMPLES = ((checkpoint, reference), ...)``), one written as a
    model directory :class:`ModelDirConformance`: every test a format runs applies to it (none is
    skipped, none passes on an empty loop)."""

    FORMAT: str = ""
    SAMPLES: tuple[tuple[Path, Path], ...] = ()

    @property
    def handler(self):
        return registry.get(self.FORMAT)

    def decode_like_tool(self, t):
        """The float values the producing tool decodes ``t`` to (default: qckpt's decode)."""
        return t.dequantize() if isinstance(t, QuantizedTensor) else t.data

    def _destination(self, tmp_path: Path, stem: str) -> Path:
        return tmp_path / (stem + (self.handler.output.suffix or ""))

    def _probes(self):
        """The probe tensors the format accepts (none for a dense-only format)."""
        probes = list(_candidates(self.handler)) if self.handler.output.quantized else []
        if isinstance(self, QuantizedFormatConformance):
            assert self.handler.output.quantized and probes, f"{self.FORMAT} accepts no probe scheme"
        return probes

    def test_dense_tensors_round_trip(self, tmp_path):
        from converter.tensor import DenseTensor
        d = DenseTensor("encoder.layer.0.attention.self.query.bias", np.linspace(-1, 1, 13, dtype=np.float32))
        dst = self._destination(tmp_path, "dense")
        self.handler.write(Checkpoint.from_tensors([d], format="memory", config=PROBE_CONFIG), dst)
        back = registry.read(Source(dst), self.handler)[d.name]
        assert np.array_equal(np.asarray(back.data, np.float32), d.data)

    # -- hostile inputs ---------------------------------------------------------------------------
    def _written(self, tmp_path: Path) -> Path:
        probes = self._probes()
        if probes:
            t = probes[0]
        else:
            from converter.tensor import DenseTensor
            t = DenseTensor("encoder.layer.0.attention.self.query.weight", np.ones((13, 40), np.float32))
        dst = self._destination(tmp_path, "hostile")
        tensors = probe_tensors(t, self.handler) if probes else [t]
        self.handler.write(Checkpoint.from_tensors(tensors, format="memory", config=PROBE_CONFIG), dst)
        return dst

    @staticmethod
    def _read_all(path: Path, handler) -> None:
        ck = registry.read(Source(path), handler)
        for name in ck.names():
            if ck.spec(name).kind != "opaque":
                ck[name]

    def test_truncated_output_raises_a_typed_error(self, tmp_path):
        dst = self._written(tmp_path)
        files = [dst] if dst.is_file() else sorted(dst.glob("*.safetensors"))
        biggest = max(files, key=lambda f: f.stat().st_size)
        data = biggest.read_bytes()
        for cut in (len(data) // 2, len(data) // 4 * 3, 7, 0):
            biggest.write_bytes(data[:cut])
            with pytest.raises(ConverterError):
                self._read_all(dst, self.handler)


class QuantizedFormatConformance(FormatConformance):
    """For a format that writes quantized tensors: the probe tensors it accepts (at least one)."""

    # -- round trip -------------------------------------------------------------------------------
    def test_round_trip_on_prime_sized_probes(self, tmp_path):
        for i, t in enumerate(self._probes()):
            rows = t.shape[t.axes.index("out")]
            assert rows == 13 or rows % 2 == 0  # 13 rows unless the format needs even ones
            dst = self._destination(tmp_path, f"rt{i}")
            tensors = probe_tensors(t, self.handler)
            self.handler.write(Checkpoint.from_tensors(tensors, format="memory", config=PROBE_CONFIG), dst)
            back = registry.read(Source(dst), self.handler)[t.name]
            assert isinstance(back, QuantizedTensor) and back.shape == t.shape, (self.FORMAT, t.scheme)
            assert np.array_equal(as_unsigned(back).codes, as_unsigned(t).codes), (self.FORMAT, t.scheme)
            assert np.array_equal(_bits(back.dequantize()), _bits(t.dequantize())), (self.FORMAT, t.scheme)

    # -- axis probe -------------------------------------------------------------------------------
    def test_axis_probe(self, tmp_path):
        for t in self._probes():
            res = run_probe(self.handler, t, tmp_path)
            assert res.passed, res.to_json()


class ToolDecodeConformance(FormatConformance):
    """For a format whose real samples (``SAMPLES``) carry the producing tool's own decode."""

    # -- real samples -----------------------------------------------------------------------------
    def test_samples_decode_like_their_tool(self):
        assert self.SAMPLES, f"{type(self).__name__} names no sample of {self.FORMAT}"
        for path, reference in self.SAMPLES:
            ck = registry.load(path)
            assert ck.format == self.FORMAT
            ref = load_file(str(reference))
            assert ref
            for name, want in ref.items():
                got = np.asarray(self.decode_like_tool(ck[name])).astype(want.dtype)
                assert got.shape == want.shape, (path.name, name)
                assert np.array_equal(_bits(got), _bits(want)), (path.name, name)


class ModelDirConformance(FormatConformance):
    """For a format written as a model directory with a ``config.json``."""

    def test_config_that_is_not_an_object_raises_a_typed_error(self, tmp_path):
        dst = self._written(tmp_path)
        assert dst.is_dir() and (dst / "config.json").exists(), f"{self.FORMAT} wrote no config.json"
        (dst / "config.json").write_text(json.dumps(["not", "an", "object"]))
        with pytest.raises(ConverterError):
            self._read_all(dst, self.handler)
