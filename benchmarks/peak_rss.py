"""Peak memory of a ``qckpt`` process, shared by the memory benchmarks (they run as ``python benchmarks/<name>.py``).

The figure is the kernel's peak resident set of the child process (``os.wait4`` ``ru_maxrss``): the interpreter,
the mapped source pages and the working set. The child is started with ``Popen`` (not forked from this process,
whose pages a forked child's ``ru_maxrss`` would count).
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def qckpt_process(root: Path, *args: str, ok: tuple[int, ...] = (0,)) -> tuple[float, int, str]:
    """``(seconds, peak RSS bytes, stdout)`` of ``python -m converter ARGS`` run from the checkout at ``root``
    (``root`` on PYTHONPATH and as the working directory: ``python -m`` puts the working directory first on the
    import path). Exits with a message when the exit status is not in ``ok``."""
    env = dict(os.environ, PYTHONPATH=str(root))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen([sys.executable, "-m", "converter", *map(str, args)], env=env, stdout=out, cwd=root)
        _, status, usage = os.wait4(proc.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read().decode()
    if code not in ok:
        raise SystemExit(f"qckpt {' '.join(map(str, args))} failed ({code}) in {root}")
    return time.perf_counter() - t0, usage.ru_maxrss * 1024, text


def digest_safetensors(d: Path) -> str:
    """SHA-256 over the ``*.safetensors`` files of folder ``d`` (name order), read in 1 MiB chunks so this process
    stays small."""
    h = hashlib.sha256()
    for f in sorted(Path(d).glob("*.safetensors")):
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
    return h.hexdigest()
