"""The README's Python API example runs as written (issue 18 item 17c: it shows an asymmetric QuantScheme).

The block under ``## Python API`` is executed unchanged in a temporary working directory (its output file
lands there; ``sample_checkpoints`` is linked in), then the values it claims are checked by hand: the codes of
``quantize_codes``, and for the asymmetric scheme unsigned 4-bit codes, integer zero points in the code
domain and every value within half a step of the float weight.
"""

from __future__ import annotations

import re

import numpy as np

from converter.scheme import ZeroPoint
from tests.conftest import REPO


def _python_api_block() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    m = re.search(r"```python\n(.*?)```", section, re.S)
    assert m, "no python block under ## Python API"
    return m.group(1)


def test_readme_python_api_example(tmp_path, monkeypatch):
    (tmp_path / "sample_checkpoints").symlink_to(REPO / "sample_checkpoints")
    monkeypatch.chdir(tmp_path)
    block = _python_api_block()
    assert "zero_point=\"integer\"" in block and "signed=False" in block  # the asymmetric example is shown
    ns: dict = {}
    exec(compile(block, "README.md (Python API)", "exec"), ns)  # noqa: S102 - our own README
    assert (tmp_path / "query-w4.safetensors").is_file()
    import converter
    back = converter.load(tmp_path / "query-w4.safetensors")
    assert back.names() == ["encoder.layer.0.attention.self.query.weight", "query.asym.weight"]

    assert ns["g"]["blk.0.attn_q.weight"].name == "encoder.layer.0.attention.self.query.weight"
    w, qa = ns["w"], ns["qa"]
    assert qa.scheme.zero_point is ZeroPoint.INTEGER and not qa.scheme.signed
    assert qa.codes.shape == (384, 384) and qa.scales.shape == qa.zero_points.shape == (384, 3)
    assert 0 <= qa.codes.min() and qa.codes.max() <= 15
    assert 0 <= qa.zero_points.min() and qa.zero_points.max() <= 15
    # x = s * (q - z), by hand, per (out, group of 128 along in)
    s = np.repeat(qa.scales.astype(np.float32), 128, axis=1)
    z = np.repeat(qa.zero_points.astype(np.float32), 128, axis=1)
    by_hand = s * (qa.codes.astype(np.float32) - z)
    assert np.allclose(ns["xa_hat"], by_hand, rtol=1e-6, atol=0)
    assert np.max(np.abs(by_hand - w) / s) <= 0.51  # half a step (+ the F16 rounding of the scale)
    assert np.array_equal(back["query.asym.weight"].dequantize(), ns["xa_hat"])
    # the README's "Conventions" for the asymmetric case, by hand: range widened to include 0,
    # scale = (max - min) / 15 stored as F16, z = round(-min / scale), q = clamp(round(x / scale) + z, 0, 15)
    g = w.astype(np.float32).reshape(384, 3, 128)
    lo, hi = np.minimum(g.min(axis=2), 0), np.maximum(g.max(axis=2), 0)
    scale = ((hi - lo) / np.float32(15)).astype(np.float16)
    sf = scale.astype(np.float32)
    zp = np.round(-lo / sf)
    codes = np.clip(np.round(g / sf[..., None]) + zp[..., None], 0, 15)
    assert np.array_equal(qa.scales, scale) and np.array_equal(qa.zero_points, zp.astype(np.uint8))
    assert np.array_equal(qa.codes, codes.reshape(384, 384).astype(np.uint8))


def test_readme_quantize_codes_claims():
    import converter
    for line in _python_api_block().splitlines():
        if line.startswith("converter.quantize_codes(") and "->" in line:
            call, claimed = line.split("#", 1)[0], line.rsplit("->", 1)[1].strip()
            assert np.array_equal(eval(call, {"converter": converter}), eval(claimed)), line  # noqa: S307
