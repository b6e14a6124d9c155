"""Requantize through ``qckpt convert --group-size``: block size 512 re-blocked exactly (CASES.md B38).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

import converter
from converter.cli import main
from converter.groups import GroupMap
from converter.layout import IN, OUT
from converter.scheme import QuantScheme, ZeroPoint
from converter.tensor import Checkpoint, QuantizedTensor
from converter.validate import validate


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


# -- B38: block size 512 re-blocked exactly to a size kernels accept ---------------------------------
@pytest.mark.parametrize("group", [128, 256])
def test_b38_reblock_512_exactly(tmp_path, group):
    K, N, G = 2048, 8, 512
    t = QuantizedTensor("model.layers.0.mlp.down_proj.weight", (OUT, IN), np.full((N, K), 2, np.uint8),
                        np.full((N, K // G), 0.5, np.float16), QuantScheme(4, False, ZeroPoint.INTEGER, "F16"),
                        GroupMap.per_group(G), zero_points=np.full((N, K // G), 3, np.int16))
    src = tmp_path / "g"
    converter.save(Checkpoint.from_tensors([t]), src, format="gptq", checkpoint_format="gptq_v2")
    w = converter.load(src)["model.layers.0.mlp.down_proj.weight"].dequantize()
    assert (w @ np.ones(K, np.float32)).tolist() == [-1024.0] * N  # 2048 * 0.5 * (2 - 3); buggy: 0
    f = next(f for f in validate(src).findings if f.code == "group-size")
    assert f.evidence["group_size"] == 512 and f.evidence["exact_reblock_to"] == 256
    dst = tmp_path / "rb"
    r = cli("convert", src, dst, "--group-size", group, "--to", "gptq", "--json")
    assert r.exit_code == 0, r.output
    assert [row["result"] for row in json.loads(r.output)["tensors"]] == ["exact"]
    back = converter.load(dst)["model.layers.0.mlp.down_proj.weight"]
    assert back.group_map.group_size == group and back.scales.shape == (N, K // group)
    assert np.array_equal(back.dequantize(), w)
    assert (back.dequantize() @ np.ones(K, np.float32)).tolist() == [-1024.0] * N
    assert not [f for f in validate(dst).findings if f.code == "group-size"]
