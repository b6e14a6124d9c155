"""``qckpt audit`` at an 80-column terminal (new-user finding): names whole, less important columns dropped,
and ``--what-if`` prices each layout once.

Why rows repeated: the what-if list priced F16 and BF16 scales as two layouts (both 2 bytes: identical
storage, identical bytes), and a float-element tensor got MX's ``block 1x32, E8M0`` from the float layouts
and again as ``mxfp4: group 32, E8M0`` from the FP4 rows, and ``e2m1 per-channel, BF16`` beside the integer
``per-channel, BF16, zero point none`` (the same scales and codes bytes).
"""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from converter.cli import main
from tests.conftest import SAMPLES


def _audit(*args: str, width: int | None = None, monkeypatch=None):
    if width is not None:
        monkeypatch.setenv("COLUMNS", str(width))
    r = CliRunner().invoke(main, ["audit", *args])
    assert r.exit_code == 0, r.output
    return r.output


def _what_if(sample: str) -> dict[str, list[dict]]:
    doc = json.loads(_audit(str(SAMPLES / sample), "--what-if", "--json"))
    return {t["name"]: t["what_if"] for t in doc["tensors"] if "what_if" in t}


def test_what_if_prices_each_layout_once_integer_tensor():
    # 4 granularities (per-channel, groups 32/64/128) x 3 zero points x scale sizes {2 bytes (F16 = BF16), 4 bytes}
    # = 24 integer layouts, + mxfp4 and nvfp4: 26 (38 rows before: F16 and BF16 priced apart).
    rows = _what_if("gptq_w4_g128_sym")["encoder.layer.0.attention.self.query.weight"]
    assert len(rows) == 26
    labels = [w["layout"] for w in rows]
    assert len(set(labels)) == 26
    assert "group 128, F16/BF16 scales, zero point none" in labels
    assert not any("BF16 scales" in lab and "F16/BF16" not in lab for lab in labels)


def test_what_if_prices_each_layout_once_fp4_tensor():
    # 24 integer + 11 float layouts (3 blocks x 2 scale dtypes, MX 1x32, 1x16 E4M3, per-channel F32 / BF16,
    # per-tensor) + 2 FP4 rows = 37 priced; 3 are the same storage under another name: 34.
    rows = _what_if("ct_nvfp4_smollm2")["model.layers.0.self_attn.k_proj.weight"]
    assert len(rows) == 34
    merged = {w["layout"]: w["same_as"] for w in rows if "same_as" in w}
    assert merged == {"e2m1 per-channel, BF16 scales": ["per-channel, F16/BF16 scales, zero point none"],
                      "e2m1 per-channel, F32 scales": ["per-channel, F32 scales, zero point none"],
                      "mxfp4: E2M1, group 32, F8_E8M0 scales": ["e2m1 block 1x32, F8_E8M0 scales (MX)"]}
    current = [w["layout"] for w in rows if w.get("current")]
    assert current == ["nvfp4: E2M1, group 16, F8_E4M3 scales + F32 global scale"]
    assert len({(w["granularity"], w["zero_point"], w["bytes"], w["layout"]) for w in rows}) == 34


@pytest.mark.parametrize("sample", ["gptq_w4_g128_sym", "ct_nvfp4_smollm2"])
def test_what_if_table_has_no_repeated_rows(sample, monkeypatch):
    out = _audit(str(SAMPLES / sample), "--what-if", width=200, monkeypatch=monkeypatch)
    part = out[out.index("what-if (theoretical)"):]
    firsts = [m.group(1).strip() for m in re.finditer(r"^│ ([^│]*)│", part, re.M)]
    layouts = [f for f in firsts if f and not f.startswith("=")]
    assert len(layouts) == len(set(layouts))


@pytest.mark.parametrize("sample,longest", [("gptq_w4_g128_sym", "encoder.layer.0.attention.output.dense.weight"),
                                            ("ct_nvfp4_smollm2", "model.layers.0.self_attn.k_proj.weight")])
def test_names_whole_at_80_columns(sample, longest, monkeypatch):
    out = _audit(str(SAMPLES / sample), "--what-if", width=80, monkeypatch=monkeypatch)
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80
    rows = [line for line in lines if line.startswith("│ ") and ("encoder." in line or "model." in line)]
    assert any(f"│ {longest} " in line for line in rows)  # the longest name on one line
    assert "padding" not in out.split("bytes by role")[0] and "stored" in out  # roles folded into stored bytes
    # the per-role bytes stay in the totals line
    assert re.search(r"bytes by role: codes \d+, padding \d+, scales \d+", out)


def test_stored_bytes_is_the_sum_of_the_roles(monkeypatch):
    doc = json.loads(_audit(str(SAMPLES / "gptq_w4_g128_sym"), "--json"))
    row = next(t for t in doc["tensors"] if t["name"] == "encoder.layer.0.intermediate.dense.weight")
    total = sum(row["bytes"].values())
    assert total == 1536 * 384 // 2 + 3 * 1536 * 2 + 3 * 1536 // 2 + 384 * 4  # codes, F16 scales, 4-bit zeros, g_idx
    out = _audit(str(SAMPLES / "gptq_w4_g128_sym"), width=80, monkeypatch=monkeypatch)
    line = next(line for line in out.splitlines() if "encoder.layer.0.intermediate.dense.weight" in line)
    assert f"{total:,}" in line


def test_wide_terminal_keeps_every_role_column(monkeypatch):
    out = _audit(str(SAMPLES / "gptq_w4_g128_sym"), width=200, monkeypatch=monkeypatch)
    head = next(line for line in out.splitlines() if line.startswith("┃") and "tensor" in line)
    for col in ("codes", "padding", "scales", "zero_points", "g_idx", "other", "dense", "theoretical bytes"):
        assert col in head
