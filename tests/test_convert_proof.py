"""The repack proof is about the bytes in the written files: a byte changed on disk after the
write (before the read-back) fails the proof, whatever the number of worker processes, and nothing
reaches DST (outputs are renamed into place only when proven); an output the repack replaces is gone
when it returns."""

from __future__ import annotations

import dataclasses

import pytest

from converter.errors import ProofFailedError
from converter.formats import registry
from converter.formats.safetensors_io import read_header
from converter.runtime import run_options
from converter.ops.convert import convert_exact


def _flip_byte(path, tensor: str, at: int) -> None:
    """XOR one byte of ``tensor``'s data in safetensors file ``path`` (in place)."""
    h = read_header(path)
    info = h.tensors[tensor]
    assert 0 <= at < info.nbytes
    with open(path, "r+b") as fh:
        fh.seek(h.data_start + info.begin + at)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x10]))


def _tampering(monkeypatch, tensor: str, at: int) -> None:
    """Make the compressed-tensors writer change one byte of ``tensor`` once it has written its (staged) output."""
    get = registry.get
    real = get("compressed-tensors")

    def write(ckpt, dst, **kw):
        summary = real.write(ckpt, dst, **kw)
        _flip_byte(dst / "model.safetensors", tensor, at)
        return summary
    fake = dataclasses.replace(real, write=write)
    monkeypatch.setattr(registry, "get", lambda name: fake if name == "compressed-tensors" else get(name))


@pytest.mark.parametrize("workers", [1, 2])
def test_clean_repack_is_all_exact(gptq_dir, tmp_path, workers):
    with run_options(workers=workers):
        rep = convert_exact(gptq_dir, tmp_path / "ct", "compressed-tensors")
    assert rep["summary"]["all_exact"] and rep["summary"]["changed"] == 0
    assert [r["name"] for r in rep["tensors"]] == registry.load(gptq_dir).names()


@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("tensor,stored,at", [
    ("model.layers.1.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight_packed", 12345),
    ("model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.q_proj.weight_packed", 0),
    ("model.embed_tokens.weight", "model.embed_tokens.weight", 7),
])
def test_a_byte_changed_in_the_written_file_fails_the_proof_and_nothing_is_committed(gptq_dir, tmp_path, monkeypatch,
                                                                                     workers, tensor, stored, at):
    _tampering(monkeypatch, stored, at)
    (tmp_path / "ct").mkdir()
    (tmp_path / "ct" / "old.txt").write_text("previous output")
    with run_options(workers=workers), pytest.raises(ProofFailedError) as e:
        convert_exact(gptq_dir, tmp_path / "ct", "compressed-tensors", overwrite=True)
    assert e.value.tensor == tensor and e.value.found == tensor  # only that one tensor failed
    assert "nothing was written" in str(e.value)
    # the previous output is untouched and no staging directory is left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct"]
    assert [p.name for p in (tmp_path / "ct").iterdir()] == ["old.txt"]


def test_overwrite_leaves_only_the_new_output(gptq_dir, tmp_path):
    dst = tmp_path / "ct"
    dst.mkdir()
    (dst / "stale.txt").write_text("from before")
    with run_options(workers=2):
        rep = convert_exact(gptq_dir, dst, "compressed-tensors", overwrite=True)
    assert rep["summary"]["all_exact"]
    assert not (dst / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["ct"]  # the replaced output was deleted


@pytest.mark.parametrize("workers", [1, 2])
def test_requantize_readback_refuses_a_byte_changed_on_disk(gptq_dir, tmp_path, monkeypatch, workers):
    """requantize_model's read-back (spread over the workers) finds the tensor whose bytes changed after the
    write, and only that one: ProofFailedError naming it, nothing at DST, no staging directory left."""
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    _tampering(monkeypatch, "model.layers.1.mlp.up_proj.weight_packed", 5)
    with run_options(workers=workers), pytest.raises(ProofFailedError) as e:
        requantize_model(gptq_dir, tmp_path / "rq", Target(bits=8, granularity="channel"), to="compressed-tensors")
    assert e.value.tensor == "model.layers.1.mlp.up_proj.weight" and e.value.found == e.value.tensor
    assert list(tmp_path.iterdir()) == []


def test_requantize_untampered_is_proven_and_committed(gptq_dir, tmp_path):
    from converter.ops.requantize_model import requantize_model
    from converter.quant.requant import Target
    rep = requantize_model(gptq_dir, tmp_path / "rq", Target(bits=8, granularity="channel"), to="compressed-tensors")
    assert rep["tensors"] and all(r["readback_bit_exact"] for r in rep["tensors"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rq"] and (tmp_path / "rq" / "model.safetensors").is_file()
    assert rep["destination"] == str(tmp_path / "rq")


@pytest.mark.parametrize("workers", [1, 2])
def test_a_failed_background_write_is_a_named_error_and_leaves_nothing(gptq_dir, tmp_path, monkeypatch, workers):
    """ENOSPC in the writer thread reaches the caller as OutputWriteError (a ConverterError and
    an OSError) naming the output, not its temporary sibling, from one or two workers; nothing is
    left at the destination."""
    import errno
    import os
    import threading

    from converter.errors import OutputWriteError
    real = os.pwrite

    def pwrite(fd, data, offset):
        if threading.current_thread().name == "qckpt-pwrite":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data, offset)
    monkeypatch.setattr(os, "pwrite", pwrite)
    dst = tmp_path / "ct"
    with run_options(workers=workers), pytest.raises(OutputWriteError) as info:
        convert_exact(gptq_dir, dst, "compressed-tensors")
    err = info.value
    assert isinstance(err, OSError) and err.errno == errno.ENOSPC
    assert err.file is not None and ".qckpt-tmp-" not in err.file and str(dst) in err.file
    assert "No space left" in str(err)
    assert not dst.exists() and not [p for p in tmp_path.iterdir() if ".qckpt-tmp-" in p.name]
