"""Which kernel path runs (converter.kernels.compiled): the mode word, the size cut-over, the cache rule."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from converter.kernels import compiled
from converter.kernels.compiled import CompiledKernelsUnavailable, jit, mode, use_compiled
from converter.runtime import run_options

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(compiled.KERNELS_ENV, raising=False)


def test_default_is_auto_and_small_work_stays_on_numpy(no_env):
    assert mode() == "auto"
    assert use_compiled(compiled.MIN_ELEMENTS - 1) is False
    assert use_compiled(compiled.MIN_ELEMENTS) is compiled.available()


def test_numpy_word_never_compiles(monkeypatch):
    monkeypatch.setenv(compiled.KERNELS_ENV, "numpy")
    assert use_compiled(10**12) is False


def test_run_option_overrides_environment(monkeypatch):
    monkeypatch.setenv(compiled.KERNELS_ENV, "numpy")
    with run_options(kernels="auto"):
        assert mode() == "auto"


def test_unknown_word_is_a_usage_error_naming_the_choices(monkeypatch):
    monkeypatch.setenv(compiled.KERNELS_ENV, "fortran")
    with pytest.raises(CompiledKernelsUnavailable, match=r"auto, numpy, numba, found 'fortran'") as e:
        mode()
    assert e.value.exit_code == 2


def test_numba_word_without_numba_names_the_extra(monkeypatch):
    monkeypatch.setenv(compiled.KERNELS_ENV, "numba")
    monkeypatch.setattr(compiled, "_AVAILABLE", False)
    with pytest.raises(CompiledKernelsUnavailable, match=r"qckpt\[fast\]"):
        mode()
    monkeypatch.setenv(compiled.KERNELS_ENV, "auto")
    assert use_compiled(10**12) is False  # auto without numba: numpy


@jit
def _sum_squares(x):
    acc = 0.0
    for v in x:
        acc += v * v
    return acc


def test_python_body_is_kept_for_logic_checks():
    assert _sum_squares.py_func(np.array([1.0, 2.0, 3.0])) == 14.0


@pytest.mark.skipif(not compiled.available(), reason="needs the fast extra (numba)")
def test_compiled_kernel_runs_and_records_its_first_call():
    assert _sum_squares(np.array([1.0, 2.0, 3.0])) == 14.0
    assert any(k.endswith("._sum_squares") for k in compiled.compile_seconds())


@pytest.mark.skipif(not compiled.available(), reason="needs the fast extra (numba)")
def test_kernel_with_no_cache_location_still_runs(tmp_path):
    """numba refuses ``cache=True`` where no cache location fits the source (here: code given with
    ``python -c``, as for a read-only install with no writable cache): the kernel compiles in memory."""
    code = textwrap.dedent("""
        from converter.kernels.compiled import jit

        @jit
        def twice(x):
            return 2 * x

        print(twice(21))
    """)
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=os.pathsep.join(sys.path))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "42"


@pytest.mark.skipif(not compiled.available(), reason="needs the fast extra (numba)")
def test_cache_directory_is_honoured(tmp_path):
    """``NUMBA_CACHE_DIR``: the machine code lands there and a second process loads it."""
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "kmod.py").write_text(textwrap.dedent("""
        from converter.kernels.compiled import jit

        @jit
        def twice(x):
            return 2 * x
    """))
    cache = tmp_path / "cache"
    env = dict(os.environ, NUMBA_CACHE_DIR=str(cache), PYTHONPATH=os.pathsep.join([str(pkg), *sys.path]))
    for _ in range(2):
        out = subprocess.run([sys.executable, "-c", "import kmod; print(kmod.twice(21))"], env=env,
                             capture_output=True, text=True, cwd=tmp_path)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "42"
    assert any(p.suffix == ".nbi" for p in cache.rglob("*")), sorted(cache.rglob("*"))


@pytest.mark.skipif(not compiled.available(), reason="the fast extra (numba) is not installed")
def test_a_warm_up_loads_the_requantize_kernels_and_a_fork_waits_for_it(tmp_path):
    """In a fresh process, warm_kernels starts loading the kernels for a large lossy plan only
    (never for a small one in auto mode), prepare_fork waits for it, and the kernels then hold the
    argument types the requantize calls use (uint8 codes here), so a forked worker calls them without loading."""
    code = textwrap.dedent("""
        import numpy as np
        from types import SimpleNamespace
        from converter.kernels import compiled
        from converter.kernels.compiled import requant
        from converter.ops.requantize_model import warm_kernels
        from converter.scheme import QuantScheme
        from converter.write.engine import prepare_fork
        s = QuantScheme(8, False)
        def view(n):
            return SimpleNamespace(spec=lambda name: SimpleNamespace(kind="quantized", shape=(n, 1), scheme=s, numel=n))
        small = warm_kernels(view(compiled.MIN_ELEMENTS - 1), {"w": ("lossy", "")})
        exact = warm_kernels(view(compiled.MIN_ELEMENTS), {"w": ("exact", "")})
        assert not compiled._WARMING
        big = warm_kernels(view(compiled.MIN_ELEMENTS), {"w": ("lossy", "")})
        prepare_fork()
        assert not compiled._WARMING
        sigs = [str(a) for sig in requant._codes_errors.compiled().signatures for a in sig]
        print(small, exact, big, any("uint8" in a for a in sigs), sorted(compiled.compile_seconds()))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), QCKPT_KERNELS="auto")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False", "True", "True", "['converter.kernels.compiled.requant._codes_errors',",
                           "'converter.kernels.compiled.requant._decode_extrema']"]


def test_a_failed_warm_up_is_dropped_and_settle_returns():
    def boom():
        raise RuntimeError("no compiler")
    compiled.warm_up(boom)
    compiled.settle()
    assert not compiled._WARMING
