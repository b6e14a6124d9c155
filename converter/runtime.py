"""Run options and process / thread rules shared by every layer (the bottom of the house).

**Run options.** One command's options (worker processes, memory budget, progress) live in a
:class:`contextvars.ContextVar`: ``qckpt`` sets them once per command (``--workers``,
``--max-memory``, ``--quiet``; :func:`converter.cli.run_options_flags`); library callers use
:func:`run_options`::

    with run_options(workers=2, max_memory="256M"):
        converter.save(ckpt, "out", format="compressed-tensors")

Being a context variable, the options hold in the block's own thread (and in the kernels' row
threads, which run in a copy of the caller's context); a thread the caller starts inside the
block begins with the defaults, as :mod:`contextvars` does: set the options in that thread.

**Processes and threads.** Worker processes (:mod:`converter.write.engine`) are forked only while
no qckpt thread lives (the kernels' pool and the background writers are stopped first), and call
:func:`mark_worker_process`: inside one, kernels stay single-threaded and BLAS runs one thread
(:func:`limit_blas_threads`, through ``threadpoolctl``), so processes and threads never
oversubscribe the cores (:func:`in_worker_process`). "No qckpt thread" is what qckpt controls: a
BLAS library's own worker threads may live at a fork (OpenBLAS and MKL register fork handlers
for that). :func:`drop_pages` releases the resident
pages of memory-mapped arrays between blocks.
"""

from __future__ import annotations

import contextlib
import contextvars
import mmap
import os
import re
from dataclasses import dataclass, replace
from typing import Any, Iterator

from converter.errors import FormatError

__all__ = ["RunOptions", "run_options", "current", "parse_size", "parse_shard_size", "auto_workers",
           "limit_blas_threads", "fixed_mmap_threshold", "drop_pages", "is_mapped", "mark_worker_process",
           "in_worker_process",
           "DEFAULT_MAX_MEMORY", "DEFAULT_MAX_SHARD_SIZE", "AUTO_PARALLEL_BYTES"]

#: Default working-memory budget for all workers together (peak RSS stays well under 512 MiB
#: for a 7B-shaped checkpoint with the interpreter's own ~50 MiB on top).
DEFAULT_MAX_MEMORY = 320 * 2**20

#: Work size (bytes) from which the default worker count (all cores) is used; smaller jobs run
#: inline, where forking the workers would cost more than it saves.
AUTO_PARALLEL_BYTES = 32 * 2**20


#: Hugging Face's shard size: transformers ``save_pretrained(max_shard_size="5GB")`` and ``huggingface_hub``'s
#: ``split_torch_state_dict_into_shards`` (decimal GB, 5 * 10**9 bytes); the Hub refuses files over 50 GB.
DEFAULT_MAX_SHARD_SIZE = 5 * 10**9


@dataclass(frozen=True)
class RunOptions:
    """Options of one command.

    Attributes
    ----------
    workers : int or None
        Worker processes; ``None`` = the number of cores available to this process.
    max_memory : int or None
        Working-memory budget in bytes for all workers together (``None``: :data:`DEFAULT_MAX_MEMORY`).
    quiet : bool
        No progress bar. The library default is quiet; ``qckpt`` shows one unless ``--quiet``.
    max_shard_size : int
        Bytes per output shard of a model directory (tensor data; a tensor is never split), the
        writers' default when a call gives none; 0 writes one ``model.safetensors`` whatever its size.
        Default :data:`DEFAULT_MAX_SHARD_SIZE` (5 GB, the Hugging Face convention).
    gguf_split_size : int
        Bytes of tensor data per part of a GGUF output (``--max-shard-size`` with a GGUF target); 0 (the default,
        as llama.cpp's converter): one file. Parts are cut as gguf-py's ``GGUFWriter(split_max_size=)`` cuts them
        (:mod:`converter.formats.gguf.split_write`).
    gguf_split_tensors : int
        At most this many tensors per part of a GGUF output (``--max-shard-tensors``; ``GGUFWriter``'s
        ``split_max_tensors``); 0: no limit.
    dry_run : bool
        Plan every write but write nothing (:mod:`converter.write.dry_run`): ``--dry-run``.
    kernels : str or None
        ``auto`` | ``numpy`` | ``numba``: which kernel path runs (:mod:`converter.kernels.compiled`);
        ``None``: ``$QCKPT_KERNELS``, else ``auto``.
    shard_job : object or None
        Set by :mod:`converter.distributed` (``--engine ray|dask``): the object that writes a model
        directory's shards instead of the local pool (its ``write_model_dir``, called by
        :func:`converter.write.files.write_model_dir`). ``None``: the local pool.
    verbose : bool
        Diagnostics on stderr: each compiled kernel's first-call compile (or cache-load) seconds, in
        every process that calls it (``--verbose``).
    engine_words : tuple of str
        The user's ``--engine`` / ``--address`` words, which a refusal's suggested command line repeats
        (:func:`converter.ops.command_line.command_line`); set by :func:`converter.distributed.job.run_command`.
    overwrite_given : bool or None
        Whether the user gave ``--overwrite``, when the command runs with another value (an engine job writes
        its staging directory with overwrite): the suggested command line repeats the user's; None: the call's.
    """

    workers: int | None = None
    max_memory: int | None = None
    quiet: bool = True
    max_shard_size: int = DEFAULT_MAX_SHARD_SIZE
    gguf_split_size: int = 0
    gguf_split_tensors: int = 0
    dry_run: bool = False
    kernels: str | None = None
    shard_job: Any = None
    verbose: bool = False
    engine_words: tuple[str, ...] = ()
    overwrite_given: bool | None = None

    @property
    def n_workers(self) -> int:
        if self.workers:
            return max(1, int(self.workers))
        try:
            return max(1, len(os.sched_getaffinity(0)))
        except (AttributeError, OSError):  # pragma: no cover - non-Linux
            return max(1, os.cpu_count() or 1)

    @property
    def memory(self) -> int:
        return int(self.max_memory) if self.max_memory else DEFAULT_MAX_MEMORY


_OPTIONS: contextvars.ContextVar[RunOptions] = contextvars.ContextVar("qckpt_run_options", default=RunOptions())


def auto_workers(total_bytes: int, n_tasks: int) -> int:
    """Worker processes for ``n_tasks`` tasks moving ``total_bytes`` bytes in all.

    The options' count (``--workers``, else every core) when ``--workers`` was given or the work
    is at least :data:`AUTO_PARALLEL_BYTES`; otherwise 1 (inline). Never more than ``n_tasks``,
    never less than 1.
    """
    opts = current()
    workers = opts.n_workers if opts.workers or total_bytes >= AUTO_PARALLEL_BYTES else 1
    return max(1, min(workers, int(n_tasks)))


def current() -> RunOptions:
    """The options in force."""
    return _OPTIONS.get()


@contextlib.contextmanager
def run_options(**changes: Any) -> Iterator[RunOptions]:
    """Set options for the enclosed block (``workers=``, ``max_memory=`` int or "512M", ``quiet=``,
    ``max_shard_size=`` int or "5GB", 0 for one file)."""
    if isinstance(changes.get("max_memory"), str):
        changes["max_memory"] = parse_size(changes["max_memory"])
    if isinstance(changes.get("max_shard_size"), str):
        changes["max_shard_size"] = parse_shard_size(changes["max_shard_size"])
    options = replace(current(), **{k: v for k, v in changes.items() if v is not None})
    token = _OPTIONS.set(options)
    try:
        yield options
    finally:
        _OPTIONS.reset(token)


_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str | int) -> int:
    """``"512M"``, ``"2GiB"``, ``"1.5g"``, ``"1000000"`` -> bytes (K/M/G alone are binary).

    Raises
    ------
    FormatError
        Not a size, or not positive.
    """
    if isinstance(text, int):
        value = text
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(text))
        if not m or m.group(2).lower() not in _UNITS:
            raise FormatError("not a memory size", field="--max-memory", expected="e.g. 512M, 2G, 1GiB",
                              found=text)
        value = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if value <= 0:
        raise FormatError("memory size must be positive", field="--max-memory", expected="> 0", found=text)
    return value


def parse_shard_size(text: str | int) -> int:
    """``"5GB"`` (10**9, as transformers and the Hub count), ``"500MB"``, ``"2GiB"``, ``"1000000"`` -> bytes per
    output shard; ``"0"`` -> 0: one file whatever its size.

    Raises
    ------
    FormatError
        Not a size, or negative.
    """
    if str(text).strip() == "0":
        return 0
    try:
        return parse_size(text)
    except FormatError as exc:
        raise FormatError("not a shard size", field="--max-shard-size",
                          expected="e.g. 5GB, 500MB, 2GiB or 0 (one file)", found=text) from exc


def limit_blas_threads(n: int = 1) -> bool:
    """Cap the threads of the BLAS numpy loaded (OpenBLAS / MKL / BLIS) at ``n``, for this process.

    Worker processes are the parallelism here; a multi-threaded BLAS inside each of them (the
    error report's small GEMMs) oversubscribes the cores and its spinning threads slow every
    process down (measured: requantize 1.4x slower with 1 worker, no gain from 2 workers).
    Uses :func:`threadpoolctl.threadpool_limits` (the limit stays in force). Returns True when a
    BLAS library was found.
    """
    from threadpoolctl import threadpool_info, threadpool_limits
    threadpool_limits(limits=int(n), user_api="blas")
    return any(info.get("user_api") == "blas" for info in threadpool_info())


def _mapping(a: Any) -> "mmap.mmap | None":
    """The ``mmap`` behind an array (itself, its ``_mmap`` or a base up to 8 levels), or None."""
    seen = 0
    while a is not None and seen < 8:
        if isinstance(a, mmap.mmap):
            return a
        mm = getattr(a, "_mmap", None)
        if isinstance(mm, mmap.mmap):
            return mm
        a = getattr(a, "base", None)
        seen += 1
    return None


def is_mapped(array: Any) -> bool:
    """``array`` is a view of a memory-mapped file (its pages are the page cache's, not its own memory)."""
    return _mapping(array) is not None


def drop_pages(*arrays: Any) -> None:
    """Release the resident pages of memory-mapped arrays (``madvise(MADV_DONTNEED)``).

    The mapping stays valid: the next access faults the pages in again from the page cache.
    Arrays that are not memory maps (or views of one) are ignored. Used between row blocks so a
    huge tensor read through a map does not stay resident as a whole.
    """
    for a in arrays:
        mm = _mapping(a)
        if mm is not None:
            with contextlib.suppress(ValueError, OSError):
                mm.madvise(mmap.MADV_DONTNEED)


def fixed_mmap_threshold(nbytes: int = 4 * 2**20, keep: int = 32 * 2**20) -> bool:
    """Make glibc ``malloc`` serve every block of ``nbytes`` or more with its own ``mmap`` (best effort).

    glibc raises its mmap threshold each time a large block is freed (up to 32 MiB), after which
    tensor-sized buffers come from the heap, which fragments and grows over hundreds of tensors.
    A fixed threshold returns every large buffer to the system when it is freed, so resident
    memory stays flat however many tensors a command processes. Inherited by forked workers.

    Fixing it also fixes glibc's trim threshold at its 128 KiB default (the dynamic one rises with the mmap
    threshold): every freed block at the top of the heap would go back to the system and be page-faulted in
    again at the next allocation (``validate`` with numpy kernels on 4 Llama-2-7B layers: 2.1 s of 5.9 s CPU in
    the kernel). So up to ``keep`` bytes of free heap (blocks under ``nbytes`` only) stay mapped for reuse.
    """
    import ctypes
    import ctypes.util
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt(ctypes.c_int(-1), ctypes.c_int(int(keep)))  # M_TRIM_THRESHOLD
        return bool(libc.mallopt(ctypes.c_int(-3), ctypes.c_int(int(nbytes))))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


_IN_WORKER = False


def mark_worker_process() -> None:
    """Called in each worker process of a pool: its kernels stay single-threaded."""
    global _IN_WORKER
    _IN_WORKER = True


def in_worker_process() -> bool:
    """True inside a worker process of a pool (:func:`mark_worker_process` was called)."""
    return _IN_WORKER
