"""Issue 18 item 3: bitsandbytes double quant in the audit and inspect.

The fixture (tests/data/bnb_double_quant, made by bitsandbytes 0.50.2 ``quantize_4bit(compress_statistics=True)``,
see its PROVENANCE.json) is the NF4 sample's five Linear weights with nested absmax. Before: the theoretical
size priced every absmax as float32 (912,384 bytes, 4.5 bits per weight) although the file stores 8-bit absmax
codes (measured 4.158), and the side arrays were listed as anonymous ``other:U8[169]``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
from click.testing import CliRunner
from safetensors import safe_open
from safetensors.numpy import load_file

from converter.cli import main
from converter.formats import registry
from converter.ops.audit import audit
from converter.ops.inspect import inspect
from converter.schemas import validate_document

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "bnb_double_quant"
BLOCK, NESTED = 64, 256


def _weights() -> dict[str, int]:
    """Element count of each quantized weight, from its quant_state JSON (bitsandbytes' own record)."""
    out = {}
    with safe_open(str(FIXTURE / "model.safetensors"), "np") as f:
        for k in f.keys():
            if k.endswith(".quant_state.bitsandbytes__nf4"):
                qs = json.loads(bytes(f.get_tensor(k)).decode())
                assert qs["blocksize"] == BLOCK and qs["nested_blocksize"] == NESTED
                out[k.split(".quant_state")[0]] = math.prod(qs["shape"])
    return out


def hand_theoretical(n: int) -> float:
    """payload N*4/8 + one 8-bit absmax code per 64-block + one float32 nested absmax per 256 blocks + the
    float32 nested_offset (code tables quant_map / nested_quant_map not counted, as headers are not)."""
    blocks = math.ceil(n / BLOCK)
    return n * 4 / 8 + blocks * 1 + math.ceil(blocks / NESTED) * 4 + 4


def test_theoretical_counts_double_quant_and_stays_below_measured():
    weights = _weights()
    assert len(weights) == 5
    doc = audit(registry.load(FIXTURE))
    validate_document(doc, "audit")
    rows = {r["name"]: r for r in doc["tensors"]}
    for name, n in weights.items():
        assert rows[name]["theoretical"]["total_bytes"] == hand_theoretical(n), name
    tot = doc["totals"]
    theo = sum(hand_theoretical(n) for n in weights.values())
    assert theo == 836_768 and tot["theoretical_quantized_bytes"] == theo  # 811008 + 25344 + 396 + 20
    # measured: every stored byte of the quantized weights (all but the biases), from the safetensors header
    with safe_open(str(FIXTURE / "model.safetensors"), "np") as f:
        stored = sum(f.get_tensor(k).nbytes for k in f.keys() if not k.endswith(".bias"))
    n_all = sum(weights.values())
    assert tot["quantized_weights"] == n_all == 1_622_016
    assert math.isclose(tot["quantized_bits_per_weight"], 8 * stored / n_all)
    assert round(tot["quantized_bits_per_weight"], 3) == 4.158  # the measured figure
    assert math.isclose(tot["theoretical_bits_per_weight"], 8 * theo / n_all)  # 4.127
    assert tot["theoretical_bits_per_weight"] < tot["quantized_bits_per_weight"]  # was 4.5 > 4.158
    assert "double-quantized scales" in tot["theoretical_note"]


def test_side_arrays_named_by_their_bitsandbytes_keys():
    doc = inspect(registry.load(FIXTURE))
    validate_document(doc, "inspect")
    row = next(r for r in doc["tensors"] if r["name"] == "pooler.dense.weight")
    parts = {s["name"].removeprefix("pooler.dense.weight."): (s["role"], s.get("part")) for s in row["stored"]}
    assert parts == {"pooler.dense.weight": ("codes", None), "absmax": ("scales", "absmax"),
                     "quant_map": ("other", "quant_map"), "quant_state.bitsandbytes__nf4": ("other", "quant_state"),
                     "nested_absmax": ("scales", "nested_absmax"), "nested_quant_map": ("other", "nested_quant_map")}
    a = audit(registry.load(FIXTURE))
    with safe_open(str(FIXTURE / "model.safetensors"), "np") as f:
        qs_bytes = sum(f.get_tensor(k).nbytes for k in f.keys() if ".quant_state." in k)
    blocks = [math.ceil(n / BLOCK) for n in _weights().values()]
    assert a["totals"]["bytes_by_part"] == {"absmax": sum(blocks), "quant_map": 5 * 16 * 4, "quant_state": qs_bytes,
                                             "nested_absmax": sum(math.ceil(b / NESTED) for b in blocks) * 4,
                                             "nested_quant_map": 5 * 256 * 4}


def test_cli_inspect_and_audit_lines(tmp_path):
    r = CliRunner().invoke(main, ["inspect", str(FIXTURE)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "quant_state:U8[" in r.output and "nested_quant_map:F32[256]" in r.output
    assert "scales(absmax):U8[2304]" in r.output and "other:" not in r.output
    r = CliRunner().invoke(main, ["audit", str(FIXTURE)], env={"COLUMNS": "400"})
    assert r.exit_code == 0, r.output
    assert "theoretical 836,768 bytes, 4.127 bits/weight" in r.output and "measured 4.158 bits/weight" in r.output


def test_double_quant_decode_equals_bitsandbytes():
    """The nested absmax decodes as bitsandbytes' dequantize_4bit does (its float16 output, bit for bit)."""
    ref = load_file(str(FIXTURE / "reference_dequant.safetensors"))["pooler.dense.weight"]
    t = registry.load(FIXTURE)["pooler.dense.weight"]
    assert np.array_equal(t.dequantize().astype(np.float16), ref)


def test_gguf_kquant_theoretical_counts_its_coded_scales(tmp_path):
    """The same fault for GGUF K-quants: their sub-block scales are 4/6/8-bit codes under an fp16 d (and dmin)
    per 256 weights, not float32 per sub-block (Q6_K was priced 8.0 bits per weight, stored 6.5625). The
    theoretical size now equals the stored one (K-quant blocks have no padding): gguf-py's GGML_QUANT_SIZES."""
    import gguf

    path = tmp_path / "k.gguf"
    w = gguf.GGUFWriter(path, "llama")
    kinds = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
    for i, k in enumerate(kinds):
        qt = gguf.GGMLQuantizationType[k]
        block, size = gguf.GGML_QUANT_SIZES[qt]
        w.add_tensor(f"blk.{i}.ffn_up.weight", np.zeros((4, 2 * size), np.uint8), raw_dtype=qt)  # [4, 512] weights
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    doc = audit(registry.load(path))
    rows = {r["name"]: r for r in doc["tensors"] if r["kind"] == "quantized"}
    # hand: bits + sub-block codes (scale, and min when the type has mins) + fp16 d (and dmin) per 256
    hand_bpw = {"Q2_K": 2 + (4 + 4) / 16 + 32 / 256, "Q3_K": 3 + 6 / 16 + 16 / 256, "Q4_K": 4 + (6 + 6) / 32 + 32 / 256,
                "Q5_K": 5 + (6 + 6) / 32 + 32 / 256, "Q6_K": 6 + 8 / 16 + 16 / 256}
    assert len(rows) == 5
    for r in rows.values():
        k = next(n.split("=")[1] for n in registry.load(path).spec(r["name"]).notes if n.startswith("ggml_type="))
        _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[k]]
        assert r["theoretical"]["bits_per_weight"] == hand_bpw[k] == 8 * size / 256, k
        assert r["theoretical"]["total_bytes"] == r["stored_bytes"] == 4 * 2 * size, k
