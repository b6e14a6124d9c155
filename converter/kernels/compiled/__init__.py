"""Optional compiled kernels (the ``fast`` extra, ``pip install qckpt[fast]``: numba).

The numpy kernels stay the reference and the default install; a compiled kernel is a second
implementation of the same function that must give **byte-identical** codes, scales, zero points and
file bytes (tests run both paths on the same inputs: ``tests/kernels/compiled``). This module decides
which path runs and compiles lazily; the kernels themselves live beside it, one concept per module.

Which path runs (:func:`use_compiled`):

- ``QCKPT_KERNELS`` (environment) or ``run_options(kernels=...)``: ``auto`` (default), ``numpy``
  (never compile) or ``numba`` (compiled whatever the size; an error when numba is missing).
- ``auto``: compiled when numba is installed and the work is at least :data:`MIN_ELEMENTS` values;
  smaller jobs stay on numpy, which is faster than importing numba (~0.3 s) and loading a cached
  kernel for them. ``qckpt --version`` and a small ``inspect`` never import numba.

Compilation (:func:`jit`): ``numba.njit(nogil=True, error_model="numpy")``, no ``fastmath`` (IEEE
results, the same as numpy's), compiled on the first call. Kernels release the GIL and are called
from qckpt's own row threads (:mod:`converter.kernels.threads`); none uses ``parallel=True``, so no
numba threading layer is ever started and forked worker processes are safe (numba's OpenMP layer
aborts after ``fork()``). The machine code is cached on disk where a cache directory is writable:
``NUMBA_CACHE_DIR`` when set, else numba's own choice (``__pycache__`` beside the source, then the
user's cache directory); a read-only install with no writable cache compiles in memory each process.
A command that knows it will call kernels loads them ahead (:func:`warm_up`: numba's import and
the cached machine code, ~0.4 s, on a thread while it plans and reads), and a process about to
fork its workers waits for that first (:func:`settle`), so the workers inherit the loaded kernels
instead of each loading them again. The first call's compile (or cache load) time is kept per
kernel (:func:`compile_seconds`) for the benchmarks and printed on stderr under ``--verbose`` (run
option ``verbose``) by each process at that call (worker processes forked before it compile or
load for themselves).
"""

from __future__ import annotations

import contextvars
import importlib.util
import os
import sys
import threading
import time
from typing import Any, Callable

from converter.errors import MissingExtraError
from converter.runtime import current

__all__ = ["KERNELS_ENV", "MODES", "MIN_ELEMENTS", "mode", "available", "use_compiled", "jit",
           "compile_seconds", "CompiledKernelsUnavailable", "warm_up", "settle"]

#: Environment variable choosing the kernel path: ``auto`` | ``numpy`` | ``numba``.
KERNELS_ENV = "QCKPT_KERNELS"
MODES = ("auto", "numpy", "numba")

#: ``auto``: fewest values in one kernel call (one tensor) worth the compiled path. Below, numpy.
MIN_ELEMENTS = 1 << 20


class CompiledKernelsUnavailable(MissingExtraError):
    """``QCKPT_KERNELS=numba`` (or ``kernels="numba"``) without numba installed, an unknown word, or a
    numba that is installed but does not import (a usage error, exit status 2)."""


_AVAILABLE: bool | None = None
_LOCK = threading.Lock()
_COMPILE_SECONDS: dict[str, float] = {}


def available() -> bool:
    """numba is installed (found without importing it)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        _AVAILABLE = importlib.util.find_spec("numba") is not None
    return _AVAILABLE


def mode() -> str:
    """The chosen path: the run option ``kernels`` if set, else ``$QCKPT_KERNELS``, else ``auto``.

    Raises
    ------
    CompiledKernelsUnavailable
        an unknown word, or ``numba`` without numba installed.
    """
    chosen = getattr(current(), "kernels", None) or os.environ.get(KERNELS_ENV) or "auto"
    chosen = chosen.strip().lower()
    if chosen not in MODES:
        raise CompiledKernelsUnavailable(f"{KERNELS_ENV}: expected one of {', '.join(MODES)}, found {chosen!r}")
    if chosen == "numba" and not available():
        raise CompiledKernelsUnavailable(f"{KERNELS_ENV}=numba but numba is not installed: pip install 'qckpt[fast]'")
    return chosen


def use_compiled(elements: int) -> bool:
    """Run the compiled kernel for one call on ``elements`` values (see the module's rules)."""
    m = mode()
    if m == "numpy":
        return False
    if m == "numba":
        return True
    return available() and elements >= MIN_ELEMENTS


def compile_seconds() -> dict[str, float]:
    """Seconds each kernel's first call spent compiling or loading its cached machine code."""
    return dict(_COMPILE_SECONDS)


def _njit(fn: Callable, signature: Any) -> Callable:
    try:
        import numba
    except Exception as exc:  # noqa: BLE001 - found by find_spec but broken (e.g. built for another numpy)
        raise CompiledKernelsUnavailable(
            f"numba is installed but does not import ({type(exc).__name__}: {exc}); reinstall it "
            f"(pip install 'qckpt[fast]') or set {KERNELS_ENV}=numpy") from exc

    options = dict(nogil=True, error_model="numpy", cache=True)
    try:
        return numba.njit(signature, **options)(fn) if signature else numba.njit(**options)(fn)
    except RuntimeError:  # no writable cache locator (read-only install, no NUMBA_CACHE_DIR)
        options["cache"] = False
        return numba.njit(signature, **options)(fn) if signature else numba.njit(**options)(fn)


class _Lazy:
    """A kernel compiled on its first call (numba imported then, not at qckpt's import)."""

    def __init__(self, fn: Callable, signature: Any) -> None:
        self.py_func, self._signature, self._compiled = fn, signature, None
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def compiled(self) -> Callable:
        if self._compiled is None:
            with _LOCK:
                if self._compiled is None:
                    self._compiled = _njit(self.py_func, self._signature)
        return self._compiled

    def __call__(self, *args: Any) -> Any:
        kernel = self.compiled()
        key = f"{self.py_func.__module__}.{self.__name__}"
        if key in _COMPILE_SECONDS:
            return kernel(*args)
        t0 = time.perf_counter()
        out = kernel(*args)  # first call: compiles (or loads the cache) for these argument types
        seconds = time.perf_counter() - t0
        if key not in _COMPILE_SECONDS:
            _COMPILE_SECONDS[key] = seconds
            if getattr(current(), "verbose", False):  # --verbose: every process reports its own
                sys.stderr.write(f"qckpt: compiled kernel {key}: first call {seconds:.2f} s "
                                 f"(compile or cache load; process {os.getpid()})\n")
        return out


def jit(fn: Callable | None = None, *, signature: Any = None) -> Any:
    """Decorator: ``fn`` compiled with numba on its first call (``nogil``, numpy error model, cached).

    The undecorated Python function stays available as ``.py_func`` (tests run it to check a kernel's
    logic without compiling). Calling a kernel imports numba: callers check :func:`use_compiled`.
    """
    if fn is None:
        return lambda f: _Lazy(f, signature)
    return _Lazy(fn, signature)


_WARMING: list[threading.Thread] = []


def warm_up(fn: Callable[[], Any]) -> None:
    """Run ``fn`` (calls of kernels on tiny inputs of the argument types a command will use: their
    machine code loaded or compiled) on a daemon thread now, in a copy of the caller's context. An
    exception is dropped: the real call raises it again, where it is reported."""
    def run() -> None:
        try:
            fn()
        except Exception:  # noqa: BLE001 - the real call reports it
            pass
    t = threading.Thread(target=contextvars.copy_context().run, args=(run,), name="qckpt-warm-up", daemon=True)
    t.start()
    _WARMING.append(t)


def settle() -> None:
    """Wait for every :func:`warm_up` of this process (before a ``fork``: a thread does not survive
    it, and one holding numba's compiler lock would leave the lock held in the child)."""
    while _WARMING:
        _WARMING.pop().join()
