"""FP4 checks of the validator (converter/validate/fp4_checks.py) on the real FP4 samples and on faults
crafted on copies of them (tmp_path only).

Correct inputs: llm-compressor's compressed-tensors NVFP4 and MXFP4 (``ct_nvfp4_smollm2``,
``ct_mxfp4_smollm2``) and ModelOpt's NVFP4 export (``modelopt_nvfp4_smollm2tiny``); every one must
stay clean under ``--strict``. The numbers a fault must show are computed here from the bytes
(``ml_dtypes`` views, numpy) or by hand, never taken from the checks themselves.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

from converter.formats import registry
from converter.formats.safetensors_io import open_safetensors, read_header
from converter.schemas import validate_document
from converter.validate import fp4_checks, validate
from tests.conftest import SAMPLES
from tests.validate.helpers import assert_finding, copy_sample, edit_config

CT_NV, CT_MX, MO_NV = "ct_nvfp4_smollm2", "ct_mxfp4_smollm2", "modelopt_nvfp4_smollm2tiny"
FP4_SAMPLES = (CT_NV, CT_MX, MO_NV)
Q = "model.layers.0.self_attn.q_proj"
EMBED = "model.embed_tokens.weight"


def raw(path, name) -> np.ndarray:
    """The stored bytes of ``name`` as uint8, shaped like the array's leading axes (1-byte dtypes) or flat."""
    h = read_header(path)
    info = h.tensors[name]
    with open(path, "rb") as f:
        f.seek(h.data_start + info.begin)
        return np.frombuffer(f.read(info.nbytes), dtype=np.uint8).copy()


def patch(path, name, fn) -> None:
    """Rewrite array ``name`` of safetensors ``path`` in place: ``fn(bytes uint8) -> same-size bytes``."""
    h = read_header(path)
    info = h.tensors[name]
    new = np.ascontiguousarray(fn(raw(path, name)), dtype=np.uint8)
    assert new.nbytes == info.nbytes
    with open(path, "r+b") as f:
        f.seek(h.data_start + info.begin)
        f.write(new.tobytes())


def serious(rep):
    return [(f.code, f.severity, f.tensor) for f in rep.findings if f.severity in ("error", "warning")]


def codes_of(rep, code):
    return [f for f in rep.findings if f.code == code]


@pytest.mark.parametrize("name", FP4_SAMPLES)
def test_real_fp4_samples_clean_strict(name):
    rep = validate(SAMPLES / name, strict=True)
    assert rep.exit_code == 0, serious(rep)
    assert not [f for f in rep.findings if f.code in ("global-scale-direction", "e8m0-bias", "scale-nonfinite",
                                                       "scale-direction", "nibble-order")]


# -- global-scale direction ----------------------------------------------------------------------------
def _invert(b: np.ndarray) -> np.ndarray:
    """F32 bytes of g -> bytes of float32(1 / g)."""
    return (np.float32(1) / b.view(np.float32)).astype(np.float32).view(np.uint8)


@pytest.mark.parametrize("which", ["one", "all"])
def test_ct_divisor_written_as_multiplier_detected(tmp_path, which):
    """A ModelOpt-style multiplier (1/g) stored in compressed-tensors' divisor field ``weight_global_scale``:
    every weight of the tensor decodes g^2 too large (g = 512 for q_proj: 2.6e5)."""
    d = copy_sample(CT_NV, tmp_path)
    path = d / "model.safetensors"
    names = [k for k in read_header(path).tensors if k.endswith("weight_global_scale")]
    g_q = float(raw(path, Q + ".weight_global_scale").view(np.float32)[0])
    s_q = raw(path, Q + ".weight_scale").view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    targets = [Q + ".weight_global_scale"] if which == "one" else names
    for n in targets:
        patch(path, n, _invert)
    rep = validate(d, strict=True)
    hits = {f.tensor: f for f in codes_of(rep, "global-scale-direction")}
    assert set(hits) == {n[:-len("_global_scale")] for n in targets}
    f = hits[Q + ".weight"]
    assert f.severity == "error" and f.evidence["likely_direction"] == "multiplier"
    # hand: effective scales read as divisor of 1/g are s * g; the largest is max(s) * g
    assert f.evidence["max_effective_scale"] == pytest.approx(float(s_q.max()) * g_q, rel=1e-6)
    assert f.evidence["factor"] == pytest.approx(g_q ** 2, rel=1e-5)
    assert f.evidence["alternative_max_effective_scale"] <= 448
    assert not codes_of(rep, "scale-direction")  # the one fault is named once
    assert rep.exit_code == 1
    validate_document(rep.to_json(), "validation-report")


def test_modelopt_multiplier_inverted_detected(tmp_path):
    d = copy_sample(MO_NV, tmp_path)
    name = "model.layers.0.mlp.down_proj.weight_scale_2"
    g = float(raw(d / "model.safetensors", name).view(np.float32)[0])
    patch(d / "model.safetensors", name, _invert)
    rep = validate(d)
    f = assert_finding(rep, "global-scale-direction", "model.layers.0.mlp.down_proj.weight")
    assert f.evidence["direction"] == "multiplier" and f.evidence["likely_direction"] == "divisor"
    assert f.evidence["factor"] == pytest.approx(1 / g ** 2, rel=1e-5)
    assert f.evidence["anchor"] in ("siblings", "1/sqrt(in)")
    assert [x.tensor for x in codes_of(rep, "global-scale-direction")] == ["model.layers.0.mlp.down_proj.weight"]


def test_native_direction_flipped_in_config_detected(tmp_path):
    """qckpt's own native file, its scheme's direction flipped from divisor to multiplier in the layout JSON."""
    from converter.ops.convert import convert_exact
    out = tmp_path / "nv.safetensors"
    convert_exact(SAMPLES / CT_NV, out, "native")
    assert validate(out, strict=True).exit_code == 0
    blob = out.read_bytes()
    n = int.from_bytes(blob[:8], "little")
    head = blob[8:8 + n].rstrip(b" ")
    assert head.count(b'global_scale\\":\\"divisor\\"') == 4  # the scheme of each of the 4 layouts
    head = head.replace(b'global_scale\\":\\"divisor\\"', b'global_scale\\":\\"multiplier\\"')
    head += b" " * (-len(head) % 8)  # safetensors pads the header to 8 bytes; offsets are relative to its end
    out.write_bytes(len(head).to_bytes(8, "little") + head + blob[8 + n:])
    rep = validate(out)
    hits = codes_of(rep, "global-scale-direction")
    assert len(hits) == 4 and {f.evidence["likely_direction"] for f in hits} == {"divisor"}
    # every tensor off by g^2 = 512^2 (q/k/v) or 936^2 (down_proj): hand values of the stored globals
    assert sorted(round(f.evidence["factor"]) for f in hits) == sorted([512 ** 2] * 3 + [936 ** 2])


def test_global_scale_evidence_hand_values():
    """Effective scales of a hand-made tensor: E4M3 scale 448 with g = 512, divisor vs multiplier."""
    from converter.codebooks import E2M1
    from converter.groups import GroupMap
    from converter.scheme import QuantScheme
    from converter.tensor import QuantizedTensor
    scheme = QuantScheme(bits=4, signed=False, scale_dtype="F8_E4M3", codebook=E2M1, global_scale="divisor")
    codes = np.tile(np.arange(16, dtype=np.uint8), (2, 2))
    scales = np.array([[448.0, 1.0], [2.0, 0.5]], dtype=ml_dtypes.float8_e4m3fn)
    t = QuantizedTensor("w", ("out", "in"), codes, scales, scheme, GroupMap.per_group(16, "in"),
                        global_scale=np.array(512, dtype=np.float32))
    ev = fp4_checks.global_scale_evidence(t)
    assert ev["max_effective"] == 448 / 512
    assert ev["alternatives"]["multiplier"]["max_effective"] == 448 * 512
    assert ev["alternatives"]["multiplier"]["factor"] == 512 ** 2
    assert ev["alternatives"]["amax"]["factor"] == pytest.approx(512 * 512 / 2688, rel=1e-6)


# -- NaN scale bytes ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,array,byte", [(CT_MX, Q + ".weight_scale", 0xFF), (CT_NV, Q + ".weight_scale", 0x7F),
                                             (CT_NV, Q + ".weight_scale", 0xFF),
                                             (MO_NV, Q + ".weight_scale", 0x7F)])
def test_nan_scale_byte_named_by_group(tmp_path, name, array, byte):
    d = copy_sample(name, tmp_path)
    row, group = 7, 5

    path = d / "model.safetensors"
    n_groups = read_header(path).tensors[array].shape[1]

    def poke(b):
        b[row * n_groups + group] = byte
        return b
    patch(path, array, poke)
    rep = validate(d)
    hits = [f for f in codes_of(rep, "scale-nonfinite") if f.tensor == Q + ".weight"]
    assert len(hits) == 1, [(f.code, f.tensor, f.message) for f in rep.findings]
    f = hits[0]
    assert f.severity == "error" and f.evidence["count"] == 1
    assert f.evidence["first_index"] == [row, group] and f.evidence["bytes"] == {f"0x{byte:02X}": 1}
    assert f"[{row}, {group}]" in f.message and f.tensor in (Q + ".weight",)
    assert rep.exit_code == 1


# -- E8M0 bias ---------------------------------------------------------------------------------------------
def _with_embedding(d):
    """Add the real SmolLM2 embedding rows (BF16, from the ModelOpt sample: the same model) as the dense
    sibling every real checkpoint has (the MXFP4 sample is a q/k/v/down subset)."""
    emb = np.asarray(open_safetensors(SAMPLES / MO_NV / "model.safetensors").get(EMBED)).astype(np.float32)  # exact
    save_file({EMBED: emb}, str(d / "model-embed.safetensors"))
    idx = d / "model.safetensors.index.json"
    j = json.loads(idx.read_text())
    j["weight_map"][EMBED] = "model-embed.safetensors"
    if "total_size" in j.get("metadata", {}):
        j["metadata"]["total_size"] += emb.nbytes
    idx.write_text(json.dumps(j, indent=2))


def _set_version(d, v):
    edit_config(d, lambda qc: qc.__setitem__("version", v), files=("config.json",))


def test_mxfp4_with_dense_sibling_clean(tmp_path):
    d = copy_sample(CT_MX, tmp_path)
    _with_embedding(d)
    rep = validate(d, strict=True)
    assert rep.exit_code == 0, serious(rep)
    assert not codes_of(rep, "e8m0-bias")


def test_legacy_version_on_standard_bytes_detected(tmp_path):
    """config says 0.13.0 (legacy: true byte = stored + 2) over bytes written by 0.19.0 (standard)."""
    d = copy_sample(CT_MX, tmp_path)
    _with_embedding(d)
    _set_version(d, "0.13.0")
    rep = validate(d)
    f = assert_finding(rep, "e8m0-bias")
    assert f.severity == "error" and f.evidence["version_rule"] == "legacy" and f.evidence["data_rule"] == "standard"
    assert f.evidence["factor"] == 4 and f.evidence["count"] == 4
    assert rep.exit_code == 1
    validate_document(rep.to_json(), "validation-report")


def test_legacy_bytes_under_standard_version_weak_evidence_keeps_the_declaration(tmp_path):
    """Bytes re-encoded the 0.13.0 way (stored = true - 2) while the config still says 0.19.0: the decoded
    RMS under the declared rule is 0.055 against the embedding's 0.118 (log2 distance 1.1), under the
    other 0.22 (0.9): the data lean to legacy, but real layers spread wider than that (v_proj 0.045,
    k_proj 0.41), so the declaration stands (the data overrule only at >= 2, a factor 4). The decode is
    then exactly 4 times smaller than the original, and only --reference can tell."""
    d = copy_sample(CT_MX, tmp_path)
    _with_embedding(d)

    path = d / "model.safetensors"
    for k in [k for k in read_header(path).tensors if k.endswith(".weight_scale")]:
        patch(path, k, lambda b: b - 2)
    rep = validate(d)
    assert not codes_of(rep, "e8m0-bias")
    a, b = registry.load(SAMPLES / CT_MX), registry.load(d)
    w0 = np.asarray(a[Q + ".weight"].dequantize(), dtype=np.float32)
    w1 = np.asarray(b[Q + ".weight"].dequantize(), dtype=np.float32)
    assert np.array_equal(w1 * 4, w0)  # 2^(byte-2-127) x 4 = 2^(byte-127): exact in float32


def test_one_small_layer_does_not_overrule_a_declared_version(tmp_path):
    """Regression (review): a correct 0.19.0 file holding only v_proj (RMS 0.045) beside the embedding
    (0.118) was decoded 4x too large because the data check (legacy fits at log2 distance 0.6, the
    declared standard rule at 1.4) overruled the version. Now the version decides and the decode
    equals compressed-tensors' own (reference_dequant, bf16) exactly."""
    from safetensors.numpy import load_file

    d = copy_sample(CT_MX, tmp_path)
    v = "model.layers.0.self_attn.v_proj"
    kept = {k: a for k, a in load_file(str(d / "model.safetensors")).items() if k.startswith(v + ".")}
    save_file(kept, str(d / "model.safetensors"))
    idx = d / "model.safetensors.index.json"
    j = json.loads(idx.read_text())
    j["weight_map"] = {k: "model.safetensors" for k in kept}
    j.get("metadata", {}).pop("total_size", None)
    idx.write_text(json.dumps(j, indent=2))
    _with_embedding(d)
    got = np.asarray(registry.load(d)[v + ".weight"].dequantize(), np.float32)
    ref = np.asarray(open_safetensors(SAMPLES / CT_MX / "reference_dequant.safetensors").get(v + ".weight"))
    assert np.array_equal(got.astype(ml_dtypes.bfloat16).view(np.uint16), ref.view(np.uint16))
    assert not codes_of(validate(d, strict=True), "e8m0-bias")



def test_no_version_no_sibling_is_info(tmp_path):
    d = copy_sample(CT_MX, tmp_path)
    edit_config(d, lambda qc: qc.pop("version", None), files=("config.json",))
    rep = validate(d, strict=True)
    f = assert_finding(rep, "e8m0-bias")
    assert f.severity == "info" and f.evidence["by"] == "default"
    assert rep.exit_code == 0, serious(rep)


# -- nibble order ------------------------------------------------------------------------------------------
def _swap_nibbles(b: np.ndarray) -> np.ndarray:
    return ((b >> 4) | (b << 4)).astype(np.uint8)


@pytest.mark.parametrize("name", [CT_MX, MO_NV])  # NVFP4: the reference comparison applies the global scale
def test_swapped_nibbles_detected_with_reference(tmp_path, name):
    """A within-byte nibble swap of E2M1 codes keeps every group (16 / 32 along in, an even number) and its
    scale, so no reference-free statistic moves (fp4_checks module docstring: histogram and per-group
    peaks are the same multiset, checked here by hand); the tool's own decode (reference_dequant)
    catches it exactly as 'nibble order reversed'."""
    d = tmp_path / name
    import shutil
    shutil.copytree(SAMPLES / name, d)
    path = d / "model.safetensors"
    stored = Q + (".weight_packed" if name == CT_MX else ".weight")
    before = raw(path, stored)
    patch(path, stored, _swap_nibbles)
    after = raw(path, stored)
    codes = lambda b: np.stack([b & 0xF, b >> 4], -1).reshape(-1)  # noqa: E731
    assert np.array_equal(np.bincount(codes(before), minlength=16), np.bincount(codes(after), minlength=16))
    plain = validate(d, strict=True)
    assert plain.exit_code == 0, serious(plain)  # the documented limit: no reference, no evidence
    rep = validate(d, reference=d / "reference_dequant.safetensors")
    f = assert_finding(rep, "layout-mismatch", Q + ".weight")
    assert "nibble order" in f.message
    assert [x.tensor for x in rep.findings if x.severity == "error"] == [Q + ".weight"]


@pytest.mark.parametrize("name,direction", [(MO_NV, "multiplier"), (CT_NV, "divisor")])
def test_direction_read_as_amax_weights_too_small_detected(name, direction):
    """Regression (review): a multiplier or divisor read as MLX's amax gives effective scales s*g/2688,
    inside E4M3's range, and weights 2.0-3.4 decades off (too small for ModelOpt's multiplier, too large
    for compressed-tensors' divisor): the range-only test never looked. Now tensors more than 2 decades
    off are named when the declared direction brings them back; the correctly labelled file stays
    clean."""
    import dataclasses

    from converter.validate import scale_direction

    ck = registry.load(SAMPLES / name)
    ts = {n: ck[n] for n in ck.quantized_names()}
    right = {n: fp4_checks.global_scale_evidence(t) for n, t in ts.items()}
    mags = {n: scale_direction.magnitude(t) for n, t in ts.items()}
    assert fp4_checks.check_global_scale_direction(right, mags) == []
    wrong_t = {n: dataclasses.replace(t, scheme=t.scheme.replace(global_scale="amax")) for n, t in ts.items()}
    wrong = {n: fp4_checks.global_scale_evidence(t) for n, t in wrong_t.items()}
    wrong_mags = {n: scale_direction.magnitude(t) for n, t in wrong_t.items()}
    found = fp4_checks.check_global_scale_direction(wrong, wrong_mags)
    far = {n for n, m in wrong_mags.items() if abs(m["decades"]) > fp4_checks.AMAX_DECADES_LIMIT}
    assert len(far) >= len(ts) - 1 and {f.tensor for f in found} == far
    assert all(f.evidence["likely_direction"] == direction for f in found)
