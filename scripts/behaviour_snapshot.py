#!/usr/bin/env python3
"""Behaviour snapshot of the ``qckpt`` CLI on every shipped sample: record it, compare two.

    PYTHONPATH=<worktree> python scripts/behaviour_snapshot.py record OUT.json [--workdir DIR]
    python scripts/behaviour_snapshot.py compare A.json B.json [--only-differing]

The safety net of a refactoring that must leave behaviour unchanged: record a snapshot before,
record one after, ``compare`` them. ``compare`` prints ``identical`` or ``differs`` per run (with a
short unified diff of what changed), then ``N runs: I identical, D differ``; exit status 0 only
when every run is identical, 1 otherwise, 2 on a usage error.

**What is run.** Every input in ``sample_checkpoints/`` (each model directory, i.e. a folder with
``config.json``; each ``.gguf`` / ``.safetensors`` file elsewhere, except the
``reference_dequant`` decodes) goes through: ``inspect`` (text, ``--json``); ``audit`` (text,
``--json``, ``--what-if --json``); ``validate`` (text, ``--json``, ``--reference <fp16> --json``);
``dequantize`` to f32 / f16 / bf16, each to a ``.safetensors`` file (``--json``) and to a directory
(text); ``convert --to T --json`` for every writable target T (``WRITABLE_TARGETS``) and one text
``convert`` to the source's format; requantizations (``REQUANT_VARIANTS``: ``--per-channel``,
``--group-size 32 --bits 4 --asym``, ``--bits 8 --per-channel --sym``) to the source's format and
to two other targets, each with ``--json`` and ``--report`` (the first also with ``--reference``),
plus one text requantization. Then ``quantize`` of ``minilm_fp16.safetensors`` in four layouts,
``validate --self-test --json`` once, and a few usage / unreadable-input errors (exit 2 and 3,
``--overwrite``). Refusals are recorded like successes: exit status and message are behaviour.

**What is recorded per run**: the argv (every path relative to the run directory, so it reads the
same on any machine), the exit status, stdout and stderr after normalisation (kept as text, so a
diff shows what changed), and for every file the run wrote (under ``out/<run>/``, per file for a
directory) its size and the sha256 of its bytes; ``.json`` files also their normalised content
(or ``json_same_as_stdout`` when a ``--report`` file repeats the ``--json`` stdout),
``.safetensors`` files their header (``__metadata__``, and per tensor dtype, shape and a sha256 of
its bytes) so that a diff names the tensor that changed. Files are compared byte for byte; a JSON
file whose content normalisation changed (a placeholder or a volatile key) is compared through its
normalised content instead. The run's time (``seconds``) is recorded, not compared.

**Determinism.** The runs execute with the run directory (``--workdir``, default a fresh temporary
directory) as the working directory, holding a copy of ``sample_checkpoints/`` and an ``out/``
folder; paths on the command line are relative, so the products' outputs (``"path"``,
``"destination"``, the rich table titles whose centring depends on their length) do not depend
on where the repository or the run directory live. Environment variables that change the output
are removed (``SCRUBBED_ENV``: ``QCKPT_*`` such as ``QCKPT_PROGRESS``, ``FORCE_COLOR``,
``COLUMNS`` ...); ``PYTHONIOENCODING=utf-8``. Normalised in stdout, stderr, JSON strings and the
names of written files (``Normaliser``): the run directory's absolute path -> ``<WORK>``,
the repository's -> ``<REPO>``, the temporary directory's -> ``<TMP>``; the atomic writer's
temporary sibling names ``.<name>.qckpt-tmp-<pid>-<12 hex>`` -> ``.qckpt-tmp-<PID>-<RAND>``;
``validate --self-test``'s ``qckpt-probe-<random>`` directories -> ``qckpt-probe-<RAND>``.
Found by recording twice and diffing: no report field varies from run to run (qckpt's reports carry
no times, pids or timestamps; the progress bar, the only timed output, is off when stderr is not a
terminal), so no JSON field is removed; ``VOLATILE_JSON_KEYS`` is the place to add one. Not
compared: the snapshot's ``meta`` (git commit, launcher, time taken) and each run's ``seconds``.
The copy of the samples is hashed before and after: runs that modify their input are named in
``meta.inputs_modified`` and on stderr.

**Launcher.** ``--launcher fork`` (default) runs each command as ``python -m converter ...`` in a
forked child of a process that has already imported qckpt's third-party dependencies (numpy,
ml_dtypes, safetensors, gguf, click, rich, jsonschema) but never ``converter`` itself: each child
imports the package fresh and runs its ``__main__`` (``runpy``), then shuts down as the
interpreter would (non-daemon threads joined, atexit handlers, stdio flushed). Importing ml_dtypes
alone takes about a second, so this cuts the record of 621 runs from ~14 minutes to 3-5 on 2 busy
cores. ``--launcher exec`` starts ``python -m converter`` afresh for every run; both record
identical snapshots (checked when this script was written: 621 identical; ``compare`` a fork and an
exec record to check it again).

``--workers N`` adds ``--workers N`` to every command that takes it (dequantize, convert,
quantize); the default records with qckpt's defaults. qckpt promises output identical for any N, so
a record with ``--workers 2`` must compare identical with a default one (checked: 621 identical).
Note that the default runs these small samples inline (qckpt forks workers by default only from
32 MiB of work), so only an explicit ``--workers N`` (N >= 2) exercises the worker pool.

Needs only the standard library (the fork launcher preloads qckpt's own dependencies if present).
Not part of the pytest suite; ``tests/test_behaviour_snapshot.py`` tests ``compare``.
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_checkpoints"
SNAPSHOT_FORMAT = 1

#: Targets ``convert --to`` can write (converter/formats registry: every format with a writer).
WRITABLE_TARGETS = ("gptq", "awq", "compressed-tensors", "mlx", "gguf", "native", "plain")
#: Requantize option sets; each runs to the source's format and to two other targets.
REQUANT_VARIANTS = (
    ("per-channel", ["--per-channel"]),
    ("g32-b4-asym", ["--group-size", "32", "--bits", "4", "--asym"]),
    ("b8-per-channel-sym", ["--bits", "8", "--per-channel", "--sym"]),
)
#: Other requantize targets, the first two that differ from the source's format.
REQUANT_OTHER_TARGETS = ("compressed-tensors", "gguf", "gptq")
#: The float sample: ``quantize`` input and ``--reference`` for validate / requantize.
FP16 = "minilm_fp16.safetensors"
#: Quantize layouts run on the float sample.
QUANTIZE_VARIANTS = (
    ("b4-g128", ["--bits", "4", "--group-size", "128"], True),
    ("b8-per-channel-asym", ["--bits", "8", "--per-channel", "--asym"], True),
    ("b2-per-tensor-f32", ["--bits", "2", "--per-tensor", "--scale-dtype", "f32"], True),
    ("b4-g64-bf16-text", ["--bits", "4", "--group-size", "64", "--scale-dtype", "bf16"], False),
)
#: Commands that take ``--workers``.
WORKER_COMMANDS = ("dequantize", "convert", "quantize")
#: Environment variables removed before every run (they change what qckpt prints).
SCRUBBED_ENV = ("FORCE_COLOR", "NO_COLOR", "CLICOLOR", "CLICOLOR_FORCE", "COLUMNS", "LINES", "TERM",
                "TTY_COMPATIBLE", "TTY_INTERACTIVE", "PYTHONWARNINGS", "PYTHONSTARTUP")
#: JSON keys whose values vary run to run, removed wherever they occur (none found in qckpt 0.1.0).
VOLATILE_JSON_KEYS: frozenset[str] = frozenset()
#: Modules the fork launcher imports once (qckpt's third-party dependencies, never converter).
PRELOAD = ("numpy", "ml_dtypes", "safetensors", "safetensors.numpy", "gguf", "click", "rich.console",
           "rich.table", "jsonschema")
RUN_TIMEOUT_S = 900


# ---------------------------------------------------------------------------------------------
# The run matrix
# ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    id: str
    args: list[str]                   # after ``qckpt``; paths relative to the run directory
    pre_create: dict[str, bytes] = field(default_factory=dict)   # files written before the run

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.id)

    @property
    def out(self) -> str:
        return f"out/{self.slug}"


def discover_inputs(samples: Path) -> list[str]:
    """Every input below ``samples`` as a path relative to it: model directories (a folder with
    ``config.json``), and ``.gguf`` / ``.safetensors`` files elsewhere (not ``reference_dequant``)."""
    found: list[str] = []

    def walk(d: Path) -> None:
        for p in sorted(d.iterdir()):
            if p.is_dir():
                if (p / "config.json").is_file():
                    found.append(p.relative_to(samples).as_posix())
                else:
                    walk(p)
            elif p.suffix in (".gguf", ".safetensors") and "reference_dequant" not in p.name:
                found.append(p.relative_to(samples).as_posix())

    walk(samples)
    return found


def source_format(rel: str) -> str:
    """The sample's format from its name (used only to pick other requantize targets)."""
    name = rel.rsplit("/", 1)[-1]
    if name.endswith(".gguf"):
        return "gguf"
    for prefix, fmt in (("gptq", "gptq"), ("awq", "awq"), ("ct_", "compressed-tensors"), ("mlx", "mlx"),
                        ("bnb", "bitsandbytes")):
        if name.startswith(prefix):
            return fmt
    return "plain"


def dst_name(target: str | None, src_fmt: str) -> str:
    """Destination name by target format: GGUF and native are single files, the rest directories."""
    fmt = target or src_fmt
    return {"gguf": "model.gguf", "native": "model.safetensors"}.get(fmt, "model")


def build_runs(inputs: list[str]) -> list[Run]:
    runs: list[Run] = []
    fp16 = f"sample_checkpoints/{FP16}"

    def add(rid: str, *args: str, pre: dict[str, bytes] | None = None) -> Run:
        r = Run(rid, list(args), pre or {})
        r.args = [a.replace("{OUT}", r.out) for a in r.args]
        runs.append(r)
        return r

    for rel in inputs:
        p = f"sample_checkpoints/{rel}"
        fmt = source_format(rel)
        add(f"inspect/{rel}/text", "inspect", p)
        add(f"inspect/{rel}/json", "inspect", p, "--json")
        add(f"audit/{rel}/text", "audit", p)
        add(f"audit/{rel}/json", "audit", p, "--json")
        add(f"audit/{rel}/what-if-json", "audit", p, "--what-if", "--json")
        add(f"validate/{rel}/text", "validate", p)
        add(f"validate/{rel}/json", "validate", p, "--json")
        add(f"validate/{rel}/reference-json", "validate", p, "--reference", fp16, "--json")
        for dt in ("f32", "f16", "bf16"):
            add(f"dequantize/{rel}/{dt}-file-json", "dequantize", p, "{OUT}/model.safetensors", "--dtype", dt,
                "--json")
            add(f"dequantize/{rel}/{dt}-dir-text", "dequantize", p, "{OUT}/model", "--dtype", dt)
        for t in WRITABLE_TARGETS:
            add(f"convert/{rel}/to-{t}-json", "convert", p, "{OUT}/" + dst_name(t, fmt), "--to", t, "--json")
        add(f"convert/{rel}/source-format-text", "convert", p, "{OUT}/" + dst_name(None, fmt))
        others = [t for t in REQUANT_OTHER_TARGETS if t != fmt][:2]
        for k, (vname, vopts) in enumerate(REQUANT_VARIANTS):
            for t in [None, *others]:
                to = ["--to", t] if t else []
                ref = ["--reference", fp16] if (k == 0 and t is None) else []
                add(f"requantize/{rel}/{vname}-to-{t or 'source'}-json", "convert", p,
                    "{OUT}/" + dst_name(t, fmt), *to, *vopts, *ref, "--json", "--report", "{OUT}/report.json")
        add(f"requantize/{rel}/per-channel-to-source-text", "convert", p, "{OUT}/" + dst_name(None, fmt),
            "--per-channel")

    if FP16 in inputs:
        for vname, vopts, js in QUANTIZE_VARIANTS:
            add(f"quantize/{FP16}/{vname}", "quantize", fp16, "{OUT}/model.safetensors", *vopts,
                *(["--json"] if js else []))
    add("validate/self-test-json", "validate", "--self-test", "--json")

    # errors and --overwrite
    gptq = "sample_checkpoints/gptq_w4_g128_sym"
    add("errors/inspect-missing-path", "inspect", "sample_checkpoints/does-not-exist")
    add("errors/validate-missing-path-json", "validate", "sample_checkpoints/does-not-exist", "--json")
    add("errors/convert-unknown-target", "convert", gptq, "{OUT}/model", "--to", "bogus")
    add("errors/convert-dst-inside-src", "convert", gptq, f"{gptq}/nested", "--to", "compressed-tensors")
    add("errors/dequantize-dst-exists", "dequantize", fp16, "{OUT}/model.safetensors",
        pre={"model.safetensors": b"an existing file\n"})
    add("errors/dequantize-overwrite", "dequantize", fp16, "{OUT}/model.safetensors", "--overwrite", "--json",
        pre={"model.safetensors": b"an existing file\n"})
    add("errors/convert-bad-max-memory", "convert", gptq, "{OUT}/model", "--max-memory", "lots")
    add("errors/quantize-no-layout", "quantize", fp16, "{OUT}/model.safetensors", "--bits", "4")
    return runs


# ---------------------------------------------------------------------------------------------
# Normalisation
# ---------------------------------------------------------------------------------------------

_TMP_SIBLING = re.compile(r"\.qckpt-tmp-\d+-[0-9a-f]+")
_PROBE_DIR = re.compile(r"qckpt-probe-[A-Za-z0-9_]+")


class Normaliser:
    def __init__(self, workdir: Path):
        subs = []
        for path, tag in ((workdir, "<WORK>"), (REPO, "<REPO>"), (Path(tempfile.gettempdir()), "<TMP>")):
            for form in {str(path), str(path.resolve())}:
                subs.append((form, tag))
        self.subs = sorted(subs, key=lambda s: -len(s[0]))   # longest first: the workdir may sit in /tmp

    def text(self, s: str) -> str:
        for old, new in self.subs:
            s = s.replace(old, new)
        s = _TMP_SIBLING.sub(".qckpt-tmp-<PID>-<RAND>", s)
        return _PROBE_DIR.sub("qckpt-probe-<RAND>", s)

    def json(self, doc):
        if isinstance(doc, dict):
            return {self.text(k): self.json(v) for k, v in doc.items() if k not in VOLATILE_JSON_KEYS}
        if isinstance(doc, list):
            return [self.json(v) for v in doc]
        if isinstance(doc, str):
            return self.text(doc)
        return doc


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def safetensors_summary(path: Path) -> dict | None:
    """``{"metadata": ..., "tensors": {name: [dtype, shape, sha256 of its bytes]}}``, or None when
    the file is not a readable safetensors file (then only its sha256 is recorded)."""
    try:
        with open(path, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            if n <= 0 or n > 100 << 20:
                return None
            header = json.loads(fh.read(n))
            base = 8 + n
            tensors = {}
            for name, info in sorted(header.items()):
                if name == "__metadata__":
                    continue
                start, end = info["data_offsets"]
                fh.seek(base + start)
                tensors[name] = [info["dtype"], info["shape"], hashlib.sha256(fh.read(end - start)).hexdigest()]
        return {"metadata": header.get("__metadata__"), "tensors": tensors}
    except (OSError, ValueError, KeyError, TypeError):
        return None


def record_outputs(out_dir: Path, norm: Normaliser) -> dict:
    files = {}
    if not out_dir.exists():
        return files
    for p in sorted(out_dir.rglob("*")):
        if p.is_dir():
            continue
        rel = norm.text(p.relative_to(out_dir).as_posix())
        entry: dict = {"bytes": p.stat().st_size, "sha256": _sha256_file(p)}
        if p.suffix == ".json":
            try:
                raw = json.loads(p.read_text(encoding="utf-8"))
            except (ValueError, UnicodeDecodeError):
                raw = None
            if raw is not None:
                entry["json"] = norm.json(raw)
                if entry["json"] != raw:
                    # a volatile field or a placeholder: compared through the normalised content
                    entry["compare"] = "normalised json"
        elif p.suffix == ".safetensors":
            st = safetensors_summary(p)
            if st is not None:
                entry["safetensors"] = norm.json(st)
        files[rel] = entry
    return files


def _canon(doc) -> str:
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False)


# ---------------------------------------------------------------------------------------------
# Launchers
# ---------------------------------------------------------------------------------------------

def run_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("QCKPT_") and k not in SCRUBBED_ENV}
    env["PYTHONIOENCODING"] = "utf-8"
    if env.get("PYTHONPATH"):   # the runs start in the run directory: relative entries would move
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    return env


def launch_exec(args: list[str], cwd: Path, env: dict, out_f: Path, err_f: Path) -> int | str:
    with open(out_f, "wb") as so, open(err_f, "wb") as se:
        proc = subprocess.Popen([sys.executable, "-m", "converter", *args], cwd=cwd, env=env,
                                stdin=subprocess.DEVNULL, stdout=so, stderr=se, start_new_session=True)
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            return "timeout"


def preload() -> list[str]:
    sys.path[:] = [os.path.abspath(p) if p else p for p in sys.path]   # the children chdir
    loaded = []
    for name in PRELOAD:
        try:
            __import__(name)
            loaded.append(name)
        except ImportError:
            pass
    assert "converter" not in sys.modules, "the fork launcher must not import converter in the parent"
    return loaded


def _child(args: list[str], cwd: Path, env: dict, out_f: Path, err_f: Path) -> None:
    """In the forked child: become ``python -m converter ARGS`` and exit with its status."""
    code = 1
    try:
        os.setpgid(0, 0)
        os.chdir(cwd)
        fds = [os.open(os.devnull, os.O_RDONLY),
               os.open(out_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
               os.open(err_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)]
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.environ.clear()
        os.environ.update(env)
        # the streams a fresh interpreter would make with PYTHONIOENCODING=utf-8 and files as stdio
        sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.FileIO(0, "r", closefd=False), encoding="utf-8")
        sys.stdout = sys.__stdout__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(1, "w", closefd=False)),
                                                       encoding="utf-8", errors="strict")
        sys.stderr = sys.__stderr__ = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)),
                                                       encoding="utf-8", errors="backslashreplace",
                                                       line_buffering=True)
        sys.argv = ["qckpt", *args]
        sys.path[0] = str(cwd)        # ``python -m`` puts the working directory first
        import runpy
        import threading
        try:
            runpy.run_module("converter", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            if exc.code is None:
                code = 0
            elif isinstance(exc.code, int):
                code = exc.code
            else:
                print(exc.code, file=sys.stderr)
                code = 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        # interpreter shutdown: join non-daemon threads, atexit handlers, flush stdio
        try:
            threading._shutdown()
        except Exception:
            pass
        import atexit
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        try:
            import traceback
            traceback.print_exc()
        finally:
            code = 1
    finally:
        os._exit(code & 0xFF)


def launch_fork(args: list[str], cwd: Path, env: dict, out_f: Path, err_f: Path) -> int | str:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(args, cwd, env, out_f, err_f)
    deadline = time.monotonic() + RUN_TIMEOUT_S
    delay = 0.001
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            try:
                os.killpg(pid, 9)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            return "timeout"
        time.sleep(delay)
        delay = min(delay * 2, 0.02)


# ---------------------------------------------------------------------------------------------
# record
# ---------------------------------------------------------------------------------------------

def _git(*args: str) -> str | None:
    try:
        return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _tree_digest(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): _sha256_file(p) for p in sorted(root.rglob("*")) if p.is_file()}


def _which_converter(cwd: Path, env: dict) -> str:
    r = subprocess.run([sys.executable, "-c", "import converter, sys; sys.stdout.write(converter.__file__)"],
                       cwd=cwd, env=env, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else f"(import failed: {r.stderr.strip()[-200:]})"


def cmd_record(ns: argparse.Namespace) -> int:
    t_start = time.monotonic()
    inputs = discover_inputs(SAMPLES)
    runs = build_runs(inputs)
    if ns.filter:
        runs = [r for r in runs if re.search(ns.filter, r.id)]
    made_workdir = ns.workdir is None
    workdir = Path(tempfile.mkdtemp(prefix="qckpt-snapshot-")) if made_workdir else Path(ns.workdir).absolute()
    if not made_workdir:
        workdir.mkdir(parents=True, exist_ok=True)
        if any(workdir.iterdir()):
            print(f"behaviour_snapshot: --workdir {workdir} is not empty", file=sys.stderr)
            return 2
    norm = Normaliser(workdir)
    env = run_env()
    try:
        shutil.copytree(SAMPLES, workdir / "sample_checkpoints")
        (workdir / "out").mkdir()
        before = _tree_digest(workdir / "sample_checkpoints")
        conv = _which_converter(workdir, env)
        print(f"behaviour_snapshot: {len(runs)} runs, {len(inputs)} inputs, converter from {conv}, "
              f"launcher {ns.launcher}, workdir {workdir}", file=sys.stderr)
        if not conv.startswith(str(REPO)):
            print(f"behaviour_snapshot: warning: converter is not this worktree's ({REPO}); "
                  f"set PYTHONPATH={REPO}", file=sys.stderr)
        preloaded = preload() if ns.launcher == "fork" else []
        launch = launch_fork if ns.launcher == "fork" else launch_exec
        extra = ["--workers", str(ns.workers)] if ns.workers else []
        records = []
        for k, run in enumerate(runs, 1):
            out_dir = workdir / run.out
            out_dir.mkdir(parents=True)
            for name, data in run.pre_create.items():
                (out_dir / name).write_bytes(data)
            args = run.args + (extra if run.args[0] in WORKER_COMMANDS else [])
            so, se = workdir / "stdout.txt", workdir / "stderr.txt"
            t0 = time.monotonic()
            rc = launch(args, workdir, env, so, se)
            dt = time.monotonic() - t0
            stdout = norm.text(so.read_bytes().decode("utf-8", errors="backslashreplace"))
            stderr = norm.text(se.read_bytes().decode("utf-8", errors="backslashreplace"))
            rec = {"id": run.id, "argv": ["qckpt", *run.args], "exit_code": rc, "stdout": stdout,
                   "stderr": stderr, "outputs": record_outputs(out_dir, norm), "seconds": round(dt, 3)}
            try:
                stdout_doc = json.loads(stdout) if stdout.lstrip().startswith(("{", "[")) else None
            except ValueError:
                stdout_doc = None
            for entry in rec["outputs"].values():   # a --report file repeating --json's stdout
                if stdout_doc is not None and entry.get("json") == stdout_doc:
                    del entry["json"]
                    entry["json_same_as_stdout"] = True
            records.append(rec)
            if not ns.keep:
                shutil.rmtree(out_dir)
            print(f"[{k:>3}/{len(runs)}] {dt:6.2f}s  exit {rc!s:>3}  {run.id}", file=sys.stderr, flush=True)
        after = _tree_digest(workdir / "sample_checkpoints")
        changed = sorted(n for n in before.keys() | after.keys() if before.get(n) != after.get(n))
        if changed:
            print(f"behaviour_snapshot: warning: the runs modified their inputs: {changed}", file=sys.stderr)
        elapsed = time.monotonic() - t_start
        head = _git("rev-parse", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
        snapshot = {
            "snapshot_format": SNAPSHOT_FORMAT,
            "meta": {"git_head": head, "git_dirty": bool(dirty), "converter": norm.text(conv),
                     "launcher": ns.launcher, "preloaded": preloaded, "workers": ns.workers,
                     "python": sys.version.split()[0], "filter": ns.filter, "inputs": inputs,
                     "inputs_modified": changed, "elapsed_s": round(elapsed, 1),
                     "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")},
            "runs": records,
        }
        Path(ns.out).write_text(json.dumps(snapshot, indent=1, sort_keys=True, ensure_ascii=False) + "\n",
                                encoding="utf-8")
        n_ok = sum(1 for r in records if r["exit_code"] == 0)
        print(f"behaviour_snapshot: recorded {len(records)} runs ({n_ok} exit 0) in {elapsed:.0f} s -> {ns.out}",
              file=sys.stderr)
        return 0
    finally:
        if not ns.keep:
            if made_workdir:
                shutil.rmtree(workdir, ignore_errors=True)
            else:
                for name in ("sample_checkpoints", "out", "stdout.txt", "stderr.txt"):
                    p = workdir / name
                    shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------
# compare
# ---------------------------------------------------------------------------------------------

def _diff(a: str, b: str, label: str, limit: int) -> list[str]:
    lines = list(difflib.unified_diff(a.splitlines(), b.splitlines(), f"A {label}", f"B {label}", n=2,
                                      lineterm=""))
    if len(lines) > limit:
        lines = lines[:limit] + [f"... ({len(lines) - limit} more diff lines)"]
    return lines


def _describe_file(name: str, fa: dict, fb: dict, limit: int) -> list[str]:
    out = [f"  output {name}: differs ({fa['bytes']} -> {fb['bytes']} bytes)"]
    if "json" in fa and "json" in fb:
        out += ["    " + x for x in _diff(_canon(fa["json"]), _canon(fb["json"]), name, limit)]
    elif fa.get("json_same_as_stdout") or fb.get("json_same_as_stdout"):
        out.append("    (its content is the stdout JSON: see the stdout diff"
                   + ("" if fa.get("json_same_as_stdout") == fb.get("json_same_as_stdout")
                      else "; in one snapshot only") + ")")
    sa, sb = fa.get("safetensors"), fb.get("safetensors")
    if sa and sb:
        ta, tb = sa["tensors"], sb["tensors"]
        only_a, only_b = sorted(ta.keys() - tb.keys()), sorted(tb.keys() - ta.keys())
        changed = sorted(n for n in ta.keys() & tb.keys() if ta[n] != tb[n])
        if only_a:
            out.append(f"    tensors only in A: {', '.join(only_a)}")
        if only_b:
            out.append(f"    tensors only in B: {', '.join(only_b)}")
        for n in changed[:10]:
            what = "bytes" if ta[n][:2] == tb[n][:2] else f"{ta[n][0]}{ta[n][1]} -> {tb[n][0]}{tb[n][1]}"
            out.append(f"    tensor {n}: {what} differ")
        if len(changed) > 10:
            out.append(f"    ... {len(changed) - 10} more tensors differ")
        if sa["metadata"] != sb["metadata"]:
            out += ["    " + x for x in _diff(_canon(sa["metadata"]), _canon(sb["metadata"]),
                                              f"{name} __metadata__", limit)]
    return out


def _same_file(fa: dict, fb: dict, stdout_a: str, stdout_b: str) -> bool:
    """Byte for byte (sha256 and size), or, when normalisation changed a JSON file's content in
    either snapshot, through the normalised JSON."""
    if "normalised json" not in (fa.get("compare"), fb.get("compare")):
        return (fa["sha256"], fa["bytes"]) == (fb["sha256"], fb["bytes"])

    def content(f: dict, stdout: str):
        return json.loads(stdout) if f.get("json_same_as_stdout") else f.get("json")
    return content(fa, stdout_a) == content(fb, stdout_b)


def compare_runs(a: dict, b: dict, limit: int) -> list[str]:
    """Lines describing how run ``b`` differs from run ``a``; empty when identical."""
    out: list[str] = []
    if a["argv"] != b["argv"]:
        out.append(f"  argv: {' '.join(a['argv'])}  ->  {' '.join(b['argv'])}")
    if a["exit_code"] != b["exit_code"]:
        out.append(f"  exit code: {a['exit_code']} -> {b['exit_code']}")
    for key in ("stdout", "stderr"):
        if a[key] != b[key]:
            out.append(f"  {key} differs:")
            out += ["    " + x for x in _diff(a[key], b[key], key, limit)]
    oa, ob = a["outputs"], b["outputs"]
    for name in sorted(oa.keys() | ob.keys()):
        if name not in ob:
            out.append(f"  output {name}: only in A")
        elif name not in oa:
            out.append(f"  output {name}: only in B")
        elif not _same_file(oa[name], ob[name], a["stdout"], b["stdout"]):
            out += _describe_file(name, oa[name], ob[name], limit)
    return out


def load_snapshot(path: str) -> dict:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(doc, dict) or doc.get("snapshot_format") != SNAPSHOT_FORMAT or "runs" not in doc:
        raise ValueError(f"{path}: not a behaviour snapshot (format {SNAPSHOT_FORMAT})")
    return doc


def cmd_compare(ns: argparse.Namespace) -> int:
    try:
        sa, sb = load_snapshot(ns.a), load_snapshot(ns.b)
    except (OSError, ValueError) as exc:
        print(f"behaviour_snapshot: {exc}", file=sys.stderr)
        return 2
    ma, mb = sa.get("meta", {}), sb.get("meta", {})
    for key in ("git_head", "launcher", "workers", "filter"):
        if ma.get(key) != mb.get(key):
            print(f"note: {key}: A {ma.get(key)}, B {mb.get(key)}")
    ra = {r["id"]: r for r in sa["runs"]}
    rb = {r["id"]: r for r in sb["runs"]}
    order = [r["id"] for r in sa["runs"]] + [r["id"] for r in sb["runs"] if r["id"] not in ra]
    same = differ = 0
    for rid in order:
        if rid not in rb:
            lines = ["  only in A"]
        elif rid not in ra:
            lines = ["  only in B"]
        else:
            lines = compare_runs(ra[rid], rb[rid], ns.diff_lines)
        if lines:
            differ += 1
            print(f"differs    {rid}")
            print("\n".join(lines))
        else:
            same += 1
            if not ns.only_differing:
                print(f"identical  {rid}")
    print(f"{len(order)} runs: {same} identical, {differ} differ")
    return 0 if differ == 0 else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="behaviour_snapshot.py", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="run every command on every sample and write a snapshot")
    rec.add_argument("out", metavar="OUT.json")
    rec.add_argument("--workdir", metavar="DIR", help="run directory (empty or new; default: a temporary one)")
    rec.add_argument("--launcher", choices=("fork", "exec"), default="fork",
                     help="fork: children of a process with the dependencies imported (default); "
                          "exec: a fresh `python -m converter` per run")
    rec.add_argument("--workers", type=int, metavar="N", help="add --workers N to dequantize/convert/quantize")
    rec.add_argument("--filter", metavar="REGEX", help="only runs whose id matches (for debugging)")
    rec.add_argument("--keep", action="store_true", help="keep the run directory and outputs")
    cmp_ = sub.add_parser("compare", help="compare two snapshots run by run")
    cmp_.add_argument("a", metavar="A.json")
    cmp_.add_argument("b", metavar="B.json")
    cmp_.add_argument("--only-differing", action="store_true", help="do not list identical runs")
    cmp_.add_argument("--diff-lines", type=int, default=40, metavar="N",
                      help="at most N lines of each unified diff (default 40)")
    ns = ap.parse_args(argv)
    return cmd_record(ns) if ns.command == "record" else cmd_compare(ns)


if __name__ == "__main__":
    sys.exit(main())
