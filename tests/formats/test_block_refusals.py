"""Integer 2-D block tensors (``Granularity.BLOCK`` with an integer scheme) are refused by every writer that
cannot hold them, with a typed NotRepresentableError naming the reason, before any data moves (review S7).

GPTQ (scales ``[nG, out]``), AWQ, compressed-tensors int (strategies tensor / channel / group), MLX affine
(``mlx.core.quantize``: one scale per row and group), GGUF (32-element blocks along ``in``), ModelOpt and fp8
(FP8 only) and gpt-oss (3-D MXFP4 experts only)
have no layout for a scale shared by a block of rows and columns; native stores it, plain
dequantizes it. bitsandbytes is read-only.
"""

from __future__ import annotations

import numpy as np
import pytest

import converter
from converter.errors import NotRepresentableError
from converter.formats import registry
from converter.groups import GroupMap
from converter.ops.convert import convert_exact
from converter.scheme import QuantScheme
from converter.tensor import Checkpoint, QuantizedTensor, spec_of

NAME = "model.layers.0.mlp.down_proj.weight"
REFUSING = {
    "gptq": "GPTQ scales are per output channel and group along in",
    "awq": "blocks are not representable in AWQ",
    "compressed-tensors": "compressed-tensors writes the block strategy for float-quantized (FP8) weights only",
    "mlx": "a 2-D block",
    "gguf": "GGUF legacy blocks are 32 consecutive elements along 'in'",
    "modelopt": "ModelOpt is written as FP8 (E4M3) only",
    "fp8": "an integer scheme needs requantizing",
    "gpt-oss": "gpt-oss MXFP4 quantizes only the GptOssExperts gate_up_proj / down_proj",
}


def _int_block() -> QuantizedTensor:
    codes = (np.arange(256 * 256) % 16 - 8).astype(np.int8).reshape(256, 256)
    return QuantizedTensor(NAME, ("out", "in"), codes, np.array([[1.0, 2.0], [0.5, 4.0]], np.float16),
                           QuantScheme(4, True, scale_dtype="F16"), GroupMap.per_block(128, 128))


def test_every_writer_is_listed():
    assert set(REFUSING) | {"native", "plain"} == set(registry.writable())


@pytest.mark.parametrize("fmt", sorted(REFUSING))
def test_check_target_refuses_integer_blocks(fmt):
    reason = registry.get(fmt).target_reason(spec_of(_int_block()))
    assert reason is not None and REFUSING[fmt] in reason


@pytest.mark.parametrize("fmt", sorted(REFUSING))
def test_convert_refuses_integer_blocks_before_writing(fmt, tmp_path):
    src = tmp_path / "src.safetensors"
    converter.save(Checkpoint.from_tensors([_int_block()]), src, format="native")
    dst = tmp_path / "out"
    with pytest.raises(NotRepresentableError) as info:
        convert_exact(src, dst, fmt)
    assert REFUSING[fmt] in str(info.value) and info.value.tensor == NAME
    assert not dst.exists() and not dst.with_suffix(".gguf").exists()


def test_native_holds_integer_blocks(tmp_path):
    t = _int_block()
    converter.save(Checkpoint.from_tensors([t]), tmp_path / "n.safetensors", format="native")
    back = converter.load(tmp_path / "n.safetensors")[NAME]
    # block (o // 128, i // 128): s * q, by hand for one element of each block
    d = back.dequantize()
    assert d[0, 0] == 1.0 * -8 and d[0, 128] == 2.0 * -8 and d[128, 1] == 0.5 * -7 and d[255, 255] == 4.0 * 7
