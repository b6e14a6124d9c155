"""Round-to-nearest FP4 (E2M1) quantizer of a 2-D ``(out, in)`` float matrix, in row blocks: MXFP4
(groups of 32 along ``in``, one E8M0 power-of-two scale each) and NVFP4 (groups of 16, one E4M3
scale each, divided by one F32 global scale per tensor).

Two rule sets, each reproducing one real encoder byte for byte (:data:`FP4_RULES`):

``ct`` -- compressed-tensors 0.19-0.20 as llm-compressor 0.14 ``model_free_ptq`` calls it
(``MXFP4A16`` / ``NVFP4A16``), every step in the weight's dtype ``D`` (BF16 / F16 / F32; a BF16 /
F16 torch operation is a float32 one rounded to nearest even) unless said otherwise:

* MX exponent (``quantization/utils/mxfp_utils.py`` ``generate_mx_scales`` / ``round_to_power_2``):
  the group's ``amax`` (exact in ``D``) is rounded to a power of two ``p`` by adding
  ``1 << (mantissa(D) - 2)`` to its bit pattern and masking the mantissa (BF16: ``+ (1 << 5)``; up
  only when the mantissa is >= 1.75), then ``e = 127 + log2(p) - 2`` (2 = ``floor(log2(6))``),
  clamped to ``[0, 255]`` (``round_to_quantized_type_dtype`` to uint8; an all-zero group gives
  ``log2(0) = -inf`` -> ``e = 0``). The group's largest values may exceed ``6 * 2^(e-127)`` and clip to
  +-6 (FP_MANIFEST.json ``ct_mxfp4_smollm2`` quirks). ``e = 255`` (the E8M0 NaN) is refused.
* MX codes: ``q = D(w / 2^(e-127))`` (the scale is a ``D`` parameter), clamped to ``[-6, 6]``.
* NVFP4 global scale (``helpers.py`` ``generate_gparam`` from llm-compressor's observer
  ``get_global_scale``): ``g = D(448 * 6 / amax)`` over the whole tensor -- or over the fused set
  (``q/k/v``, ``gate/up``: llm-compressor ``entrypoints/model_free/microscale.py``
  ``DEFAULT_FUSED_MAPPINGS``, one observer for the set) -- with ``amax`` clamped to ``finfo(D).tiny``
  and a non-finite result replaced by 1; stored F32 (a *divisor*: effective scale ``s / g``).
  ``D = BF16`` gives e.g. 936.0 where float32 would give 934.957.
* NVFP4 group scale (``calculate_qparams``): ``s = E4M3(clamp(f32(g) * f32(D(amax / 6)), +-448))``
  (round to nearest even, ml_dtypes); a zero becomes E4M3 ``eps`` = 0.125 (``_get_dtype_eps``).
* NVFP4 codes (``forward_helpers.py`` ``_quantize`` with the global scale): ``q = f32(w) / (s / g)``
  in float32 (the global scale is an F32 tensor, so torch promotes), clamped to ``[-6, 6]``.
* Rounding to E2M1 (``fp4_utils.py`` ``cast_to_fp4``): nearest, ties to the even code -- 0.25 -> 0,
  0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4. The sign bit (``pack_fp4_to_uint8``:
  ``signbit`` of ``magnitude * torch.sign(q)``) is set for ``q < 0``, so a negative quotient that
  rounds to zero is ``0x8`` (-0.0) while a ``-0.0`` weight (``sign(-0.0) = 0``) is ``0x0``.

``mlx`` -- MLX 0.32 ``mx.quantize(w, group_size=32, bits=4, mode="mxfp4")`` (checked bit for bit on
the real SmolLM2 layer-0 weights with mlx 0.32.4): ``e = 127 + ceil(log2(amax / 6))`` (float32;
never clips: ``amax <= 6 * 2^(e-127)``), ``q = w / 2^(e-127)`` in float32, rounded to nearest with
ties toward the *smaller magnitude* (0.25 -> 0, 0.75 -> 0.5, 1.75 -> 1.5, 3.5 -> 3, 5 -> 4), and a
zero is always ``0x0``. The exponents differ from ``ct`` in ~22% of groups (``ct`` 1 lower).
``mx.quantize(w, group_size=16, bits=4, mode="nvfp4")`` (no global scale; checked bit for bit on the same
weights against the mlx-lm sample sample_checkpoints/mlx_nvfp4_smollm2tiny): ``s = E4M3(amax / 6)``
(float32, round to nearest even, E4M3 subnormals included), ``q = w / s`` in float32, the same E2M1
rounding. Not verified against MLX, so refused or stated: ``amax / 6 > 448`` (E4M3 overflow) is
refused; a group whose ``s`` is 0 (all zero, or ``amax / 6`` below E4M3's smallest subnormal / 2) gets
codes 0 (decodes to 0).

Codes are the 4-bit E2M1 fields (``converter.codebooks.E2M1_VALUES``: bit 3 sign, bits 0-2 the
magnitude index), one uint8 per element; packing two per byte is a format's business.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from converter.errors import QuantizationError, exact_str
from converter.kernels.error_sums import ErrorSums

#: Elements per row block of :func:`quantize_fp4_rows`.
FP4_BLOCK_ELEMENTS = 1 << 18
#: E2M1's largest magnitude, E4M3's largest finite value.
E2M1_MAX, E4M3_MAX = 6.0, 448.0
#: Group sizes along ``in`` (OCP MX v1.0; NVFP4).
MX_GROUP, NV_GROUP = 32, 16
#: The rule sets: the encoder each reproduces.
FP4_RULES = {"ct": "compressed-tensors 0.19-0.20 (llm-compressor model_free_ptq MXFP4A16 / NVFP4A16)",
             "mlx": "MLX 0.32 mx.quantize(mode='mxfp4' | 'nvfp4', no global scale)"}
#: Magnitudes of the E2M1 codes 0..7.
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], np.float32)
#: Midpoints between consecutive magnitudes; the even code of a tie is the one below at 0.25, 1.25,
#: 2.5, 5.0 and the one above at 0.75, 1.75, 3.5.
_MIDPOINTS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], np.float32)
_TIE_UP = np.array([False, True, False, True, False, True, False])
_E4M3 = ml_dtypes.float8_e4m3fn
_E4M3_EPS = np.float32(ml_dtypes.finfo(_E4M3).eps)  # 0.125


@dataclass(frozen=True, eq=False)
class Fp4Quantized:
    """What :func:`quantize_fp4_rows` made of an ``(out, in)`` matrix.

    Attributes
    ----------
    codes : ndarray of uint8, ``(out, in)``: E2M1 fields 0..15.
    scales : ndarray ``(out, in / group)``: E8M0 bytes as ``uint8`` (MXFP4) or ``float8_e4m3fn`` (NVFP4).
    global_scale : float32 0-d array (NVFP4, a divisor) or None.
    degenerate_groups : int
        Groups whose values are all zero.
    clipped : int
        Elements whose quotient exceeded 6 in magnitude (saturated to +-6).
    """

    codes: np.ndarray
    scales: np.ndarray
    global_scale: np.ndarray | None
    degenerate_groups: int
    clipped: int


def e2m1_codes(q: np.ndarray, rule: str = "ct") -> np.ndarray:
    """E2M1 fields of float32 quotients ``q`` (any shape), clamped to +-6 first.

    ``ct``: ties to the even code, sign bit for ``q < 0`` (so ``0x8`` for a negative quotient that
    rounds to zero). ``mlx``: ties toward the smaller magnitude, zero always ``0x0``.
    """
    a = np.minimum(np.abs(q), np.float32(E2M1_MAX))
    idx = np.zeros(q.shape, np.uint8)
    for t, up in zip(_MIDPOINTS, _TIE_UP):
        idx += (a >= t) if (up and rule == "ct") else (a > t)
    neg = q < 0
    if rule == "mlx":
        neg &= idx > 0
    return idx | (neg.astype(np.uint8) << 3)


def _round_to(x: np.ndarray, arith: np.dtype) -> np.ndarray:
    return x if np.dtype(arith) == np.float32 else x.astype(arith).astype(np.float32)


def mx_exponents(amax: np.ndarray, *, rule: str = "ct", arith: np.dtype = np.float32,
                 tensor: str | None = None) -> np.ndarray:
    """E8M0 exponents (uint8, bias 127) of groups from their absmax (float32, exact in ``arith``).

    Raises
    ------
    QuantizationError
        An exponent of 255 (E8M0 NaN: the group's absmax overflows), naming the group.
    """
    amax = np.asarray(amax, np.float32)
    with np.errstate(divide="ignore", over="ignore", invalid="ignore"):
        if rule == "mlx":
            e = 127 + np.ceil(np.log2(amax / np.float32(E2M1_MAX)))
        else:
            d = np.dtype(arith)
            a = amax.astype(d)
            if d == np.float32:
                bits, mant, ui = a.view(np.uint32).astype(np.int64), 23, np.uint32
            else:
                bits, mant, ui = a.view(np.uint16).astype(np.int64), (7 if d == ml_dtypes.bfloat16 else 10), np.uint16
            width = 8 * d.itemsize
            mask = ((1 << (width - mant)) - 1) << mant  # sign and exponent
            p = ((bits + (1 << (mant - 2))) & mask).astype(ui).view(d).astype(np.float32)
            e = 127 + np.floor(np.log2(p)) - 2
        e = np.clip(np.nan_to_num(e, nan=0.0, neginf=0.0, posinf=255.0), 0, 255).astype(np.uint8)
    if (e == 255).any():
        idx = tuple(int(i) for i in np.unravel_index(int(np.argmax(e == 255)), e.shape))
        raise QuantizationError("the group's absmax overflows the E8M0 scale", tensor=tensor, field="scales",
                                expected="exponent < 255 (255 is E8M0 NaN)",
                                found=f"absmax {exact_str(amax[idx])} at group {list(idx)}")
    return e


def nvfp4_global_scale(amax: float, *, arith: np.dtype = np.float32) -> np.float32:
    """compressed-tensors' NVFP4 global scale ``arith(448 * 6 / max(amax, tiny))`` (a divisor),
    1 when that is not finite; returned as the stored F32 value."""
    d = np.dtype(arith)
    a = np.asarray(amax, np.float32).astype(d)
    a = np.maximum(a, np.asarray(ml_dtypes.finfo(d).tiny, d)).astype(np.float32)
    with np.errstate(over="ignore", divide="ignore"):
        g = _round_to(np.asarray(np.float32(E4M3_MAX * E2M1_MAX) / a, np.float32), d)
    return np.float32(g) if np.isfinite(g) else np.float32(1.0)


def nvfp4_group_scales(amax: np.ndarray, global_scale: np.float32, *, arith: np.dtype = np.float32) -> np.ndarray:
    """E4M3 group scales ``E4M3(clamp(g * arith(amax / 6), +-448))``, a zero replaced by E4M3 eps (0.125)."""
    s = _round_to((np.asarray(amax, np.float32) / np.float32(E2M1_MAX)).astype(np.float32), arith)
    s = np.clip(np.float32(global_scale) * s, -E4M3_MAX, E4M3_MAX).astype(_E4M3)
    return np.where(s.astype(np.float32) == 0, _E4M3_EPS, s.astype(np.float32)).astype(_E4M3)


def tensor_amax(values: Any, *, tensor: str | None = None) -> float:
    """``max |w|`` of a 2-D matrix or row source (read in row blocks).

    Raises
    ------
    QuantizationError
        Non-finite values.
    """
    rows, n = values.shape
    step = max(1, FP4_BLOCK_ELEMENTS // max(1, n))
    m = 0.0
    for r0 in range(0, rows, step):
        a = float(np.abs(np.asarray(values[r0:min(rows, r0 + step)], np.float32)).max(initial=0.0))
        if not np.isfinite(a):
            raise QuantizationError("input values are not all finite", tensor=tensor, field="values",
                                    found=f"NaN/inf in rows from {r0}")
        m = max(m, a)
    return m


def _mlx_nvfp4_scales(amax: np.ndarray, tensor: str | None, r0: int) -> np.ndarray:
    """MLX nvfp4's E4M3 group scales ``E4M3(amax / 6)`` (float32, nearest even); refused above 448."""
    s = (amax / np.float32(E2M1_MAX)).astype(np.float32)
    if (s > E4M3_MAX).any():
        raise QuantizationError("a group's amax / 6 exceeds E4M3's 448: MLX nvfp4 without a global scale has no "
                                "such scale (MLX's behaviour there is not reproduced)", tensor=tensor, field="values",
                                expected="amax <= 2688", found=f"{float(s.max()) * E2M1_MAX} in rows from {r0}")
    return s.astype(_E4M3)


def quantize_fp4_rows(values: Any, kind: str, *, rule: str = "ct", arith: np.dtype = np.float32,
                      global_amax: float | None = None, tensor: str | None = None,
                      compare: ErrorSums | None = None) -> Fp4Quantized:
    """MXFP4 (``kind="mxfp4"``) or NVFP4 (``"nvfp4"``) round-to-nearest of an ``(out, in)`` matrix.

    Parameters
    ----------
    values : ndarray ``(out, in)`` or a row source (:class:`converter.rows.Rows`), read in row blocks.
        ``in`` must be a multiple of the group size (32 / 16).
    rule : ``"ct"`` or ``"mlx"`` (MLX: NVFP4 without a global scale), see the module docstring.
    arith : the weight's dtype (float32 / float16 / bfloat16).
    global_amax : NVFP4: the absmax the global scale is computed from (a fused set's); default the
        tensor's own (one extra pass).
    tensor : name, for errors.
    compare : error sums fed each block's values and reconstruction (effective scale in float32).

    Raises
    ------
    QuantizationError
        Non-finite values, ``in`` not a multiple of the group size, an unknown kind / rule, an
        E8M0 overflow.
    """
    if kind not in ("mxfp4", "nvfp4") or rule not in FP4_RULES:
        raise QuantizationError("unsupported FP4 target", tensor=tensor, field="kind",
                                expected="mxfp4 | nvfp4, rule ct | mlx", found=f"{kind} rule {rule}")
    gs = MX_GROUP if kind == "mxfp4" else NV_GROUP
    rows, n = values.shape
    if n % gs:
        raise QuantizationError(f"{kind} groups of {gs} must divide the row length", tensor=tensor, field="shape",
                                expected=f"in % {gs} == 0", found=f"in = {n}")
    ng = n // gs
    codes = np.empty((rows, n), np.uint8)
    scales = np.empty((rows, ng), np.uint8 if kind == "mxfp4" else _E4M3)
    g = None
    if kind == "nvfp4" and rule == "ct":
        g = nvfp4_global_scale(tensor_amax(values, tensor=tensor) if global_amax is None else global_amax,
                               arith=arith)
    step = max(1, FP4_BLOCK_ELEMENTS // max(1, n))
    degenerate = clipped = 0
    bbuf = None
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        x = np.asarray(values[r0:r1], np.float32).reshape(r1 - r0, ng, gs)
        amax = np.abs(x).max(axis=2)
        if not np.isfinite(amax).all():
            raise QuantizationError("input values are not all finite", tensor=tensor, field="values",
                                    found=f"NaN/inf in rows from {r0}")
        degenerate += int(np.count_nonzero(amax == 0))
        with np.errstate(over="ignore", under="ignore"):
            if kind == "mxfp4":
                e = mx_exponents(amax, rule=rule, arith=arith, tensor=tensor)
                scales[r0:r1] = e
                s = np.ldexp(np.float32(1), e.astype(np.int32) - 127).astype(np.float32)
                if rule == "ct":
                    s = _round_to(s, arith)
                    q = _round_to(x / s[..., None], arith)
                else:
                    q = x / s[..., None]
            elif rule == "mlx":
                sc = _mlx_nvfp4_scales(amax, tensor, r0)
                scales[r0:r1] = sc
                s = sc.astype(np.float32)
                with np.errstate(divide="ignore", invalid="ignore"):
                    q = np.where(s[..., None] == 0, np.float32(0), x / s[..., None]).astype(np.float32)
            else:
                sc = nvfp4_group_scales(amax, g, arith=arith)
                scales[r0:r1] = sc
                s = sc.astype(np.float32) / g
                q = x / s[..., None]
        clipped += int(np.count_nonzero(np.abs(q) > E2M1_MAX))
        c = e2m1_codes(q, rule)
        codes[r0:r1] = c.reshape(r1 - r0, n)
        if compare is not None:
            if bbuf is None:
                bbuf = np.empty((step, n), np.float32)
            mag = E2M1_MAGNITUDES[c & 7]
            b = np.where(c & 8, -mag, mag) * s[..., None]
            compare.add(r0, x.reshape(r1 - r0, n), b.reshape(r1 - r0, n).astype(np.float32), bbuf[:r1 - r0])
    return Fp4Quantized(codes, scales, None if g is None else np.asarray(g, np.float32), degenerate, clipped)
