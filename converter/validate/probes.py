"""Axis probes (DESIGN.md section 4): every writer, read back by its reader, must be unambiguous.

For each registered format with a writer, probe tensors are built in schemes the format accepts
(asked through its ``check_target``: symmetric / asymmetric, 4 / 8 bits, group sizes 8-128, with
a partial final group where the format allows one, act-order ``g_idx`` where it allows that):

- rectangular, with distinct sizes (``13 x 40`` before falling back to multiples the format needs);
- power-of-two scales that vary by row *and* by group (``2^((3o mod 7) - 3 + 2(g mod 3) - 2)``),
  so a scale applied on the wrong axis is off by a power of two;
- distinct codes along the packed axis (``(5i + 3o) mod 2^b``: 16 consecutive codes all differ),
  so any permutation inside a word shows;
- zero points that vary by row and group and never sit at the centre.

The probe is written with the format's writer to a temporary directory and read back with its
reader. The declared decode must equal the probe's own decode bit for bit, and every alternative
interpretation of :mod:`converter.validate.interpretations` (transposed storage, reversed dims,
scales in the other orientation / on the other axis / on the wrong groups, other nibble orders,
zero offset +-1, sequential groups instead of ``g_idx``) must *fail* to reproduce it.

The probe report's human rendering is :func:`converter.report.validation.render_self_test`.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from converter.exit_codes import FINDINGS, OK
from converter.errors import ConverterError
from converter.formats import registry
from converter.formats.source import Source
from converter.groups import GroupMap
from converter.layout import EXPERT, IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor, spec_of
from converter.validate.interpretations import alternatives

#: A Hugging Face name every writer can map (GGUF maps names per architecture), with its config.
PROBE_NAME = "encoder.layer.0.attention.self.query.weight"
PROBE_CONFIG = {"model_type": "bert", "architectures": ["BertModel"]}
GROUP_SIZES = (16, 32, 8, 64, 128)
#: (bits, signed, zero point) candidates, in order of preference.
SCHEMES = ((4, False, ZeroPoint.NONE), (4, False, ZeroPoint.INTEGER), (8, False, ZeroPoint.NONE),
           (4, True, ZeroPoint.NONE), (8, True, ZeroPoint.NONE), (4, False, ZeroPoint.FLOAT))
MAX_PER_FORMAT = 8


def probe_tensor(out: int, inp: int, group: int, bits: int, signed: bool, zero: ZeroPoint, *,
                 act_order: bool = False, name: str = PROBE_NAME) -> QuantizedTensor:
    """A probe tensor ``(out, in)`` with groups of ``group`` along ``in`` (see module docstring)."""
    o = np.arange(out)[:, None]
    i = np.arange(inp)[None, :]
    n = 1 << bits
    step = 5 if bits <= 4 else 37
    codes = (step * i + 3 * o) % n
    scheme = QuantScheme(bits, signed, zero, "F16")
    codes = (codes - (n // 2)).astype(np.int8) if signed else codes.astype(np.uint8)
    g_idx = None
    ng = -(-inp // group)
    if act_order:
        rng = np.random.default_rng(7)
        g_idx = (rng.permutation(inp) // group).astype(np.int32)
    gm = GroupMap.per_group(group, IN, g_idx)
    go = np.arange(out)[:, None]
    gg = np.arange(ng)[None, :]
    exps = (3 * go) % 7 - 3 + 2 * (gg % 3) - 2
    scales = np.exp2(exps).astype(np.float16)
    zp = None
    if zero is ZeroPoint.INTEGER:
        z = (go + 3 * gg + 1) % (n - 2) + 1
        z = np.where(z == n // 2, z + 1, z)
        zp = (z - (n // 2) if signed else z).astype(np.int16)
    elif zero is ZeroPoint.FLOAT:
        z = ((go + 3 * gg + 1) % (n - 2) + 1).astype(np.float32)
        zp = (-(z * scales.astype(np.float32))).astype(np.float16)
    return QuantizedTensor(name, (OUT, IN), codes, scales, scheme, gm, zero_points=zp)


def float_probe_tensor(out: int, inp: int, block: tuple[int, int] | str | None, element: str = "e4m3", *,
                       name: str = PROBE_NAME) -> QuantizedTensor:
    """An FP8 probe ``(out, in)``: distinct finite element codes along ``in`` (``(5i + 3o) mod 120 + 1``,
    the sign bit set on odd ``i + o``), F32 power-of-two scales per ``block`` tile (``(block_out,
    block_in)``), per output channel (``"channel"``) or one for the tensor (None), varying by block row
    and block column (by row for channels)."""
    from converter.codebooks import element as float_element
    o = np.arange(out)[:, None]
    i = np.arange(inp)[None, :]
    codes = (((5 * i + 3 * o) % 120 + 1) | (((i + o) % 2) << 7)).astype(np.uint8)
    scheme = QuantScheme(8, False, ZeroPoint.NONE, "F32", codebook=float_element(element).values)
    if block is None:
        return QuantizedTensor(name, (OUT, IN), codes, np.full((1, 1), 0.125, np.float32), scheme,
                               GroupMap.per_tensor())
    if block == "channel":
        scales = np.exp2((3 * np.arange(out)) % 7 - 3).astype(np.float32)[:, None]
        return QuantizedTensor(name, (OUT, IN), codes, scales, scheme, GroupMap.per_channel(OUT))
    gm = GroupMap.per_block(*block)
    go, gi = np.meshgrid(np.arange(-(-out // block[0])), np.arange(-(-inp // block[1])), indexing="ij")
    scales = np.exp2((3 * go) % 7 - 3 + 2 * (gi % 3) - 2).astype(np.float32)
    return QuantizedTensor(name, (OUT, IN), codes, scales, scheme, gm)


#: The name of the stacked-expert probe (a fused MoE projection as transformers names gpt-oss's).
EXPERT_PROBE_NAME = "model.layers.0.mlp.experts.gate_up_proj"


def mx_expert_probe_tensor(experts: int = 3, out: int = 14, inp: int = 96, *,
                           name: str = EXPERT_PROBE_NAME) -> QuantizedTensor:
    """A stacked MXFP4 probe ``(expert, out, in)``: E2M1 codes ``(5i + 3o + 7e) mod 16`` (16 consecutive codes
    differ; code 8, -0, appears), E8M0 scales per 32 along ``in`` ``2^((3o mod 7) - 3 + 2(g mod 3) - 2 + e)``
    varying by expert, row and group; ``out`` even (a fused gate / up pair per two rows)."""
    import ml_dtypes

    from converter.codebooks import E2M1_VALUES
    e = np.arange(experts)[:, None, None]
    o = np.arange(out)[None, :, None]
    codes = ((5 * np.arange(inp)[None, None, :] + 3 * o + 7 * e) % 16).astype(np.uint8)
    g = np.arange(-(-inp // 32))[None, None, :]
    exps = (3 * o) % 7 - 3 + 2 * (g % 3) - 2 + e
    scales = (exps + 127).astype(np.uint8).view(ml_dtypes.float8_e8m0fnu)
    scheme = QuantScheme(4, False, ZeroPoint.NONE, "F8_E8M0", codebook=E2M1_VALUES)
    return QuantizedTensor(name, (EXPERT, OUT, IN), codes, scales, scheme, GroupMap.per_group(32, IN))


def probe_tensors(t: QuantizedTensor, handler) -> list:
    """The checkpoint a probe is written as with ``handler``: ``t`` and the tensors the format requires
    beside it (:attr:`FormatHandler.probe_companions`; none by default)."""
    return [t] + list(handler.probe_companions(t) if handler.probe_companions is not None else [])


def _float_candidates(handler) -> Iterator[QuantizedTensor]:
    """FP8 E4M3 probes a format accepts: 8 x 16 blocks on 13 x 40 (partial in both axes; else
    128 x 128 blocks on 136 x 200), per output channel, then one scale per tensor."""
    blocked = float_probe_tensor(13, 40, (8, 16))
    if handler.target_reason(spec_of(blocked)) is not None:
        blocked = float_probe_tensor(136, 200, (128, 128))
    for t in (blocked, float_probe_tensor(13, 40, "channel"), float_probe_tensor(13, 40, None)):
        if handler.target_reason(spec_of(t)) is None:
            yield t


def _shapes(group: int) -> Iterator[tuple[int, int]]:
    """(out, in) candidates: distinct odd sizes with a partial tail first, then what strict formats need."""
    yield 13, 2 * group + group // 2
    yield 13, 3 * group
    yield 24, 2 * group + group // 2
    yield 24, 3 * group
    yield 40, 5 * group


@dataclass
class ProbeResult:
    """One probe: the scheme, the declared decode check and each alternative's verdict."""

    format: str
    scheme: str
    shape: tuple[int, ...]
    groups: str
    declared_exact: bool = False
    alternatives: dict[str, bool] = field(default_factory=dict)  # name -> rejected (True is good)
    error: str | None = None

    @property
    def passed(self) -> bool:
        return (self.error is None and self.declared_exact and bool(self.alternatives)
                and all(self.alternatives.values()))

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "scheme": self.scheme, "shape": list(self.shape), "groups": self.groups,
                "declared_exact": self.declared_exact, "alternatives": dict(self.alternatives),
                "passed": self.passed, "error": self.error}


def _first_accepted(handler, bits: int, signed: bool, zero: ZeroPoint, act: bool) -> QuantizedTensor | None:
    for g in GROUP_SIZES:
        for out, inp in _shapes(g):
            t = probe_tensor(out, inp, g, bits, signed, zero, act_order=act)
            if handler.target_reason(spec_of(t)) is None:
                return t
    return None


def _candidates(handler) -> Iterator[QuantizedTensor]:
    """One probe per accepted (bits, signed, zero point, act-order) combination, preferred shapes first."""
    for bits, signed, zero in SCHEMES:
        for act in (False, True):
            t = _first_accepted(handler, bits, signed, zero, act)
            if t is not None:
                yield t
    yield from _float_candidates(handler)
    experts = mx_expert_probe_tensor()
    if handler.target_reason(spec_of(experts)) is None:
        yield experts


def run_probe(handler, t: QuantizedTensor, workdir: Path) -> ProbeResult:
    """Write ``t`` with ``handler``, read it back, check the declared decode and every alternative."""
    res = ProbeResult(handler.name, t.scheme.describe(), t.shape, t.group_map.describe())
    dst = workdir / f"{handler.name}-{len(list(workdir.iterdir()))}"
    if handler.output.suffix:
        dst = dst.with_suffix(handler.output.suffix)
    try:
        handler.write(Checkpoint.from_tensors(probe_tensors(t, handler), format="memory", config=PROBE_CONFIG), dst)
        back = registry.read(Source(dst), handler)[t.name]
    except ConverterError as exc:
        res.error = exc.render()
        return res
    if not isinstance(back, QuantizedTensor):
        res.error = "read back as a dense tensor"
        return res
    ref = t.dequantize()
    res.declared_exact = bool(np.array_equal(back.dequantize(), ref))
    for name, alt in alternatives(back).items():
        res.alternatives[name] = not bool(np.allclose(alt, ref, rtol=1e-3, atol=0.0))
    return res


def self_test(formats: list[str] | None = None) -> dict[str, Any]:
    """Run the probes on every registered format with a writer (or ``formats``); JSON-ready summary.

    A format passes when at least one probe ran and every probe passed; formats that only write
    dense floats are listed as skipped.
    """
    rows: list[dict[str, Any]] = []
    verdicts: dict[str, str] = {}
    names = formats or registry.writable()
    with tempfile.TemporaryDirectory(prefix="qckpt-probe-") as tmp:
        work = Path(tmp)
        for name in names:
            handler = registry.get(name)
            if handler.write is None or not handler.output.quantized:
                verdicts[name] = "skipped (no quantized writer)"
                continue
            results = []
            for t in _candidates(handler):
                results.append(run_probe(handler, t, work))
                if len(results) >= MAX_PER_FORMAT:
                    break
            rows += [r.to_json() for r in results]
            ok = bool(results) and all(r.passed for r in results)
            verdicts[name] = "pass" if ok else ("no probe accepted" if not results else "FAIL")
    failed = [n for n, v in verdicts.items() if v not in ("pass",) and not v.startswith("skipped")]
    return {"schema": "qckpt.probe-report/1", "formats": verdicts, "probes": rows,
            "exit_code": FINDINGS if failed else OK}

