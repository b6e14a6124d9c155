"""Plain float safetensors: reading the real fp16 sample, writing single and sharded outputs."""

import json

import numpy as np
from safetensors.numpy import load_file

import converter
from converter.formats.plain import write_plain
from converter.tensor import Checkpoint, DenseTensor
from tests.conftest import SAMPLES


def test_reads_real_fp16_sample():
    ck = converter.load(SAMPLES / "minilm_fp16.safetensors")
    assert ck.format == "plain" and len(ck) == 14
    ref = load_file(str(SAMPLES / "minilm_fp16.safetensors"))
    w = ck["encoder.layer.0.output.dense.weight"]
    assert w.data.dtype == np.float16 and w.shape == (384, 1536)
    np.testing.assert_array_equal(w.data, ref["encoder.layer.0.output.dense.weight"])


def test_sharded_write_and_read(tmp_path):
    rng = np.random.default_rng(0)
    ck = Checkpoint.from_tensors([DenseTensor(f"l{i}.weight", rng.standard_normal((8, 16)).astype(np.float32))
                                  for i in range(5)], config={"model_type": "x"})
    out = tmp_path / "sharded"
    res = write_plain(ck, out, dtype="F32", max_shard_bytes=600)
    idx = json.loads((out / "model.safetensors.index.json").read_text())
    assert len(set(idx["weight_map"].values())) == 5 and "model.safetensors.index.json" in res["files"]
    assert idx["metadata"]["total_size"] == 5 * 8 * 16 * 4
    back = converter.load(out)
    for name in ck.names():
        np.testing.assert_array_equal(back[name].data, ck[name].data)
