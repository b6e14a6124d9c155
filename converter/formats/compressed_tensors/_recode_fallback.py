"""Stand-in for ``converter.quant.recode`` (``as_signed``, ``as_integer_zero``) until it lands on main.

Only the two exact re-expressions the compressed-tensors writer needs, with the same names and
contracts as the common brief describes. Delete this module once ``converter.quant.recode`` exists
(the writer imports that first).
"""

from __future__ import annotations

import numpy as np

from ...errors import NotRepresentableError
from ...scheme import ZeroPoint


def as_signed(t):
    """Signed-code form of ``t``: ``q' = q - 2^(b-1)``, integer zero ``z' = z - 2^(b-1)`` (exact).

    Raises
    ------
    NotRepresentableError
        For float-bias schemes (moving the centre would change the bias by ``s * 2^(b-1)``,
        which may round; convert with :func:`as_integer_zero` first).
    """
    s = t.scheme
    if s.signed:
        return t
    if s.codebook is not None or s.zero_point is ZeroPoint.FLOAT:
        raise NotRepresentableError("only integer-grid schemes without float bias re-express as signed codes",
                                    tensor=t.name, field="scheme", found=s.describe())
    c = 1 << (s.bits - 1)
    codes = (t.codes.astype(np.int16) - c).astype(np.int8)
    zp = None if t.zero_points is None else (t.zero_points.astype(np.int16) - c).astype(np.int8)
    return t.replace(codes=codes, zero_points=zp, scheme=s.replace(signed=True))


def as_integer_zero(t):
    """Explicit integer zero points: NONE -> the centre; FLOAT bias -> ``z = -bias / scale``.

    Raises
    ------
    NotRepresentableError
        When some ``-bias/scale`` is not an integer in the code range, or ``-z*s`` does not
        reproduce the stored bias in the scale dtype.
    """
    s = t.scheme
    if s.zero_point is ZeroPoint.INTEGER:
        return t
    dt = np.int8 if s.signed else np.uint8
    if s.zero_point is ZeroPoint.NONE:
        zp = np.full(t.scales.shape, s.center, dtype=dt)
        return t.replace(zero_points=zp, scheme=s.replace(zero_point=ZeroPoint.INTEGER))
    sc = t.scales.astype(np.float64)
    bias = t.zero_points.astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = np.where(sc != 0, -bias / sc, np.where(bias == 0, float(s.center), np.nan))
    zr = np.rint(z)
    ok = np.isfinite(z) & (z == zr) & (zr >= s.qmin) & (zr <= s.qmax)
    if ok.all():
        back = (-(zr * sc)).astype(t.scales.dtype)
        ok &= (back.astype(np.float64) == bias) | (sc == 0)
    if not ok.all():
        idx = np.unravel_index(int(np.argmin(ok)), ok.shape)
        raise NotRepresentableError("float bias is not -z*scale for an integer zero in the code range",
                                    tensor=t.name, field="zero_points",
                                    expected=f"integer -bias/scale in [{s.qmin}, {s.qmax}]",
                                    found=f"{float(z[idx])!r} at group {list(map(int, idx))}",
                                    hint="requantize to an integer-zero scheme")
    return t.replace(zero_points=zr.astype(dt), scheme=s.replace(zero_point=ZeroPoint.INTEGER))
