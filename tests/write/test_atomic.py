"""Tests for converter.write.atomic."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from converter.errors import OutputExistsError
from converter.write.atomic import atomic_output, check_not_inside, sha256_file


def siblings(path):
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.qckpt-tmp-"))


def test_file_committed_on_success(tmp_path):
    dst = tmp_path / "out.bin"
    with atomic_output(dst) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(f".out.bin.qckpt-tmp-{os.getpid()}-")
        assert not dst.exists()
        tmp.write_bytes(b"hello")
    assert dst.read_bytes() == b"hello" and siblings(dst) == []


@pytest.mark.parametrize("exc", [RuntimeError, KeyboardInterrupt])
def test_nothing_left_on_exception(tmp_path, exc):
    dst = tmp_path / "out.bin"
    with pytest.raises(exc):
        with atomic_output(dst) as tmp:
            tmp.write_bytes(b"partial")
            raise exc()
    assert list(tmp_path.iterdir()) == []


def test_nothing_left_on_exception_dir(tmp_path):
    dst = tmp_path / "outdir"
    with pytest.raises(RuntimeError):
        with atomic_output(dst, is_dir=True) as tmp:
            assert tmp.is_dir()
            (tmp / "a").write_text("x")
            raise RuntimeError
    assert list(tmp_path.iterdir()) == []


def test_refuses_existing(tmp_path):
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old")
    with pytest.raises(OutputExistsError) as info:
        with atomic_output(dst):
            pytest.fail("body must not run")
    assert "overwrite=True" in str(info.value) and str(dst) in str(info.value)
    assert info.value.exit_code == 2 and dst.read_bytes() == b"old"


def test_refuses_dst_created_meanwhile(tmp_path):
    dst = tmp_path / "out.bin"
    with pytest.raises(OutputExistsError):
        with atomic_output(dst) as tmp:
            tmp.write_bytes(b"new")
            dst.write_bytes(b"other writer")
    assert dst.read_bytes() == b"other writer" and siblings(dst) == []


def test_overwrite_file(tmp_path):
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old")
    with atomic_output(dst, overwrite=True) as tmp:
        tmp.write_bytes(b"new")
    assert dst.read_bytes() == b"new" and siblings(dst) == []


def test_overwrite_dir(tmp_path):
    dst = tmp_path / "outdir"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    with atomic_output(dst, overwrite=True, is_dir=True) as tmp:
        (tmp / "new.txt").write_text("new")
    assert sorted(p.name for p in dst.iterdir()) == ["new.txt"] and siblings(dst) == []


def test_overwrite_failure_keeps_old(tmp_path):
    dst = tmp_path / "out.bin"
    dst.write_bytes(b"old")
    with pytest.raises(ValueError):
        with atomic_output(dst, overwrite=True) as tmp:
            tmp.write_bytes(b"new")
            raise ValueError
    assert dst.read_bytes() == b"old" and siblings(dst) == []


def test_body_writes_nothing(tmp_path):
    from converter.errors import ConverterError
    with pytest.raises(ConverterError, match="nothing was written"):
        with atomic_output(tmp_path / "out.bin"):
            pass


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_cleans_stale_siblings(tmp_path):
    dst = tmp_path / "out.bin"
    dead = _dead_pid()
    stale_file = tmp_path / f".out.bin.qckpt-tmp-{dead}-abc"
    stale_file.write_bytes(b"x")
    stale_dir = tmp_path / f".out.bin.qckpt-tmp-{dead}-def.old"
    stale_dir.mkdir()
    (stale_dir / "f").write_text("x")
    live = tmp_path / f".out.bin.qckpt-tmp-{os.getppid()}-live"  # parent process is alive
    live.write_bytes(b"x")
    other = tmp_path / f".other.qckpt-tmp-{dead}-abc"
    other.write_bytes(b"x")
    with atomic_output(dst) as tmp:
        tmp.write_bytes(b"ok")
    assert not stale_file.exists() and not stale_dir.exists()
    assert live.exists() and other.exists() and dst.read_bytes() == b"ok"


def test_check_not_inside(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "model.safetensors").write_bytes(b"")
    with pytest.raises(OutputExistsError, match="is the source"):
        check_not_inside(src, tmp_path / "src" / ".." / "src")
    with pytest.raises(OutputExistsError, match="inside the source"):
        check_not_inside(src, src / "out")
    with pytest.raises(OutputExistsError, match="is the source"):
        check_not_inside(src / "model.safetensors", src / "model.safetensors")
    with pytest.raises(OutputExistsError, match="source is inside the destination"):
        check_not_inside(src / "model.safetensors", tmp_path)
    link = tmp_path / "link"
    link.symlink_to(src)
    with pytest.raises(OutputExistsError):
        check_not_inside(src, link / "x")
    check_not_inside(src, tmp_path / "out")
    check_not_inside(src / "model.safetensors", tmp_path / "out.safetensors")


def test_sha256_file(tmp_path):
    data = os.urandom(3000)
    (tmp_path / "f").write_bytes(data)
    assert sha256_file(tmp_path / "f", chunk_size=1000) == hashlib.sha256(data).hexdigest()


# -- errors name the destination, never the temporary sibling ------------------------------------
def test_converter_error_naming_the_temp_is_rewritten_to_dst(tmp_path):
    from converter.errors import FormatError
    dst = tmp_path / "out.safetensors"
    with pytest.raises(FormatError) as info:
        with atomic_output(dst) as tmp:
            raise FormatError(f"bad header in {tmp}", file=tmp, tensor="a", field="shape", found=str(tmp))
    e = info.value
    assert e.file == str(dst) and e.found == str(dst) and e.message == f"bad header in {dst}"
    assert ".qckpt-tmp-" not in str(e) and str(dst) in str(e)


def test_converter_error_naming_a_file_inside_the_temp_dir_is_rewritten(tmp_path):
    from converter.errors import FormatError
    dst = tmp_path / "model_dir"
    with pytest.raises(FormatError) as info:
        with atomic_output(dst, is_dir=True) as tmp:
            raise FormatError("shape does not match the plan", file=tmp / "model-00001-of-00002.safetensors")
    assert info.value.file == str(dst / "model-00001-of-00002.safetensors")
    assert ".qckpt-tmp-" not in str(info.value)


@pytest.mark.parametrize("fmt, name", [("native", "o.safetensors"), ("plain", "p.safetensors"), ("gptq", "g")])
def test_writer_errors_name_the_destination(tmp_path, fmt, name):
    # a loader returning another shape than its spec: the writer's plan check names DST, not the temp
    import numpy as np
    from converter.errors import FormatError
    from converter.formats.registry import get
    from converter.tensor import Checkpoint, DenseTensor, spec_of
    t = DenseTensor("a", np.zeros((2, 2), np.float32))
    ck = Checkpoint({"a": spec_of(t)}, lambda n: DenseTensor("a", np.zeros((3, 3), np.float32)), format="memory")
    dst = tmp_path / name
    with pytest.raises(FormatError, match="shape does not match the plan") as info:
        get(fmt).write(ck, dst)
    assert ".qckpt-tmp-" not in str(info.value) and info.value.file.startswith(str(dst))
    assert list(tmp_path.iterdir()) == []
