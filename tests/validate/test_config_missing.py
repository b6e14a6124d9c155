"""config-missing: a checkpoint whose format loaders find it by its quantization config, without one (a new user's
finding: validate said clean for a GPTQ folder whose quantize_config.json and quantization_config were deleted)."""

from __future__ import annotations

import pytest

from converter.validate import validate
from tests.conftest import SAMPLES
from tests.validate.helpers import copy_sample



@pytest.mark.parametrize("sample", ["gptq_w4_g128_sym", "awq_gemm_w4_g128_zp", "ct_pack_w4a16_group128_sym"])
def test_a_checkpoint_without_its_quantization_config_is_a_warning(tmp_path, sample):
    """The new user's F6: a GPTQ folder with quantize_config.json deleted and quantization_config removed from
    config.json still decodes (bits and group size from the shapes), but transformers / vLLM / GPTQModel would not
    load it as GPTQ: config-missing (warning, naming the loaders); the same for AWQ and compressed-tensors. The
    shipped samples (with their configs) have no such finding."""
    import json
    assert "config-missing" not in validate(SAMPLES / sample).codes()
    d = copy_sample(sample, tmp_path)
    (d / "quantize_config.json").unlink(missing_ok=True)
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config", None)
    (d / "config.json").write_text(json.dumps(cfg))
    report = validate(d)
    if sample.startswith("ct_"):  # compressed-tensors is read through its config: without one, an error finding
        assert report.exit_code == 1 and "config-mismatch" in report.codes()
        return
    found = [f for f in report.findings if f.code == "config-missing"]
    assert len(found) == 1 and found[0].severity == "warning" and found[0].tensor is None
    assert "will not load" in found[0].message and found[0].evidence["format"] == report.format


@pytest.mark.parametrize("sample", ["gptq_w4_g128_sym", "awq_gemm_w4_g128_zp"])
def test_a_bare_file_of_a_correct_checkpoint_is_not_config_missing(sample):
    """``validate DIR/model.safetensors`` reads the file alone (a bare file has no config.json by design: the shard
    of a sharded model, the file a user points at): the loaders load the directory, whose config is there, so the
    file is not config-missing (it was, a warning on every shipped GPTQ / AWQ file, and exit 1 under --strict)."""
    report = validate(SAMPLES / sample / "model.safetensors", strict=True)
    assert report.format == sample.split("_")[0]
    assert "config-missing" not in report.codes() and report.exit_code == 0
