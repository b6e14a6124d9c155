"""Issue 18 item 1: the convert summary never calls a rounding "exact".

compressed-tensors int4 asym -> MLX: the codes and fp16 scales are carried, but MLX stores the zero point as a
float bias ``-z*s`` in fp16, so the values differ by that rounding (the issue's 4.9e-4). Before, ``--json``
said ``"all_exact": true`` and the human line counted the biases as the exact tensors. Now ``all_exact`` is
false, the quantized and dense tensors are counted apart, and the rounding is stated with its size.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from safetensors.numpy import load_file

from converter.cli import main
from converter.formats import registry
from converter.ops.convert import convert_exact, summarize_rows
from converter.quant.recode import as_unsigned
from converter.schemas import validate_document

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
ASYM = SAMPLES / "ct_pack_w4a16_group128_asym"


def hand_bias_rounding() -> dict[str, float]:
    """Per weight: max over groups of |fp16(-z*s) - (-z*s)| in float64, the source's unsigned zero points z and
    fp16 scales s: the largest change of any value (identical codes q: (q*s + b) - (q - z)*s = b + z*s)."""
    src = registry.load(ASYM)
    out = {}
    for name in src.quantized_names():
        t = as_unsigned(src[name])
        exact = -(t.zero_points.astype(np.float64) * t.scales.astype(np.float64))
        out[name] = float(np.max(np.abs(exact.astype(np.float16).astype(np.float64) - exact)))
    return out


def test_asym_to_mlx_is_not_all_exact(tmp_path):
    rep = convert_exact(ASYM, tmp_path / "out", "mlx")
    validate_document(rep, "convert-report")
    hand = hand_bias_rounding()
    assert len(hand) == 7 and max(hand.values()) == 2.0 ** -11  # 4.9e-4: half an fp16 ulp of a bias in [1, 2)
    # the written biases are those fp16 roundings (read with safetensors, not qckpt's reader)
    written = load_file(str(tmp_path / "out" / "model.safetensors"))
    src = registry.load(ASYM)
    for name in hand:
        t = as_unsigned(src[name])
        b = written[name.removesuffix(".weight") + ".biases"]
        assert b.dtype == np.float16
        assert np.array_equal(b, (-(t.zero_points.astype(np.float64) * t.scales.astype(np.float64))).astype(np.float16))
    rows = {r["name"]: r for r in rep["tensors"]}
    for name, h in hand.items():  # values compared in float32: the hand figure to float32's precision
        assert rows[name]["mode"] == "exact_up_to_rounding" and not rows[name]["bit_exact"]
        assert abs(rows[name]["max_abs_diff"] - h) <= 2.0 ** -20, (name, rows[name]["max_abs_diff"], h)
        assert rows[name]["rounding"] == "zero points stored as float biases -z*s rounded to F16"
    s = rep["summary"]
    assert s["all_exact"] is False and s["within_rounding"] is True  # a CI gate on all_exact is not fooled
    q, d = s["quantized"], s["dense"]
    assert (q["tensors"], q["exact"], q["exact_up_to_rounding"], q["changed"]) == (7, 0, 7, 0)
    assert (d["tensors"], d["exact"], d["exact_up_to_rounding"], d["changed"]) == (7, 7, 0, 0)  # the biases
    assert q["roundings"] == [{"rounding": "zero points stored as float biases -z*s rounded to F16", "tensors": 7,
                               "max_abs_diff": q["max_rounding_diff"]}]
    assert abs(q["max_rounding_diff"] - max(hand.values())) <= 2.0 ** -20 and "roundings" not in d


def test_human_summary_states_the_rounding(tmp_path):
    r = CliRunner().invoke(main, ["convert", str(ASYM), str(tmp_path / "out"), "--to", "mlx"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert ("7 quantized tensors: 0 bit-exact, 7 exact up to rounding (zero points stored as float biases -z*s "
            "rounded to F16: 7, max |diff| 0.0004883), 0 changed (lossy)") in r.output
    assert "7 dense tensors: 7 bit-exact, 0 changed (lossy)" in r.output
    assert "NOT bit-exact: codes identical" in r.output and "all tensors bit-exact" not in r.output
    r = CliRunner().invoke(main, ["convert", str(ASYM), str(tmp_path / "j"), "--to", "mlx", "--json"])
    assert json.loads(r.output)["summary"]["all_exact"] is False


def test_summary_three_verdicts_by_kind():
    """Hand rows: bit-exact, exact up to a stated rounding and lossy (changed) counted per kind."""
    rows = [{"name": "a", "kind": "quantized", "mode": "exact"},
            {"name": "b", "kind": "quantized", "mode": "exact_up_to_rounding", "max_abs_diff": 0.25, "rounding": "r1"},
            {"name": "c", "kind": "quantized", "mode": "exact_up_to_rounding", "max_abs_diff": 0.5, "rounding": "r1"},
            {"name": "d", "kind": "quantized", "mode": "changed", "max_abs_diff": 3.0},
            {"name": "e", "kind": "dense", "mode": "passthrough"},
            {"name": "f", "kind": "dense", "mode": "changed"}]
    s = summarize_rows(rows)
    assert (s["tensors"], s["exact"], s["exact_up_to_rounding"], s["changed"]) == (6, 2, 2, 2)
    assert s["all_exact"] is False and s["within_rounding"] is False and s["max_rounding_diff"] == 0.5
    assert s["quantized"]["roundings"] == [{"rounding": "r1", "tensors": 2, "max_abs_diff": 0.5}]
    assert (s["dense"]["exact"], s["dense"]["changed"]) == (1, 1)
    only_exact = summarize_rows([rows[0], rows[4]])
    assert only_exact["all_exact"] is True and only_exact["within_rounding"] is True
