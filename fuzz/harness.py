"""Shared fuzzing harness: a corpus built from the real samples, mutations, and the reader exercise.

Used by ``tests/test_fuzz.py`` (hypothesis, few examples, CI) and ``fuzz/fuzz_readers.py`` (many
random cases, a report). A *case* is a small real checkpoint (a file or a model directory) copied
to a scratch directory and mutated; :func:`exercise` reads it through ``converter.load``
(auto-detect) and through every registered format explicitly, loads every tensor and dequantizes
it, and runs ``inspect`` and ``audit``. Only :class:`converter.errors.ConverterError` may escape;
anything else is a bug at the boundary where foreign data entered.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from converter.errors import ConverterError, MalformedInputError

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_checkpoints"
#: Tensors kept in the reduced ("mini") samples: one attention projection and one MLP output.
KEEP = ("encoder.layer.0.attention.self.query", "encoder.layer.0.output.dense")
INTERESTING_INTS = [0, 1, -1, 2, 3, 7, 8, 31, 32, 33, 127, 128, 255, 256, 4096, 2**31 - 1, 2**31, 2**32,
                    2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1, 2**64, 10**30]
INTERESTING_VALUES: list[Any] = INTERESTING_INTS + [None, True, False, 0.5, -3.25, 1e308, "", "x", "gptq", "awq",
                                                    "int", "float", "symmetric", [], [1], {}, {"a": 1}]
DTYPE_NAMES = ["BOOL", "U8", "I8", "I16", "U16", "F16", "BF16", "I32", "U32", "F32", "F64", "I64", "U64",
               "F8_E4M3", "F8_E5M2", "F4", "F6_E2M3", "Q4", "", "f16"]


class Draw(Protocol):
    """The source of choices: hypothesis ``data`` or a seeded ``random.Random``."""

    def int(self, lo: int, hi: int) -> int: ...
    def choice(self, seq): ...


class RandomDraw:
    """Choices from a ``random.Random`` (the long fuzzing script)."""

    def __init__(self, rng) -> None:
        self.rng = rng

    def int(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def choice(self, seq):
        return seq[self.rng.randrange(len(seq))]


class HypothesisDraw:
    """Choices from hypothesis ``st.data()`` (shrinkable)."""

    def __init__(self, data) -> None:
        from hypothesis import strategies as st
        self.data, self.st = data, st

    def int(self, lo: int, hi: int) -> int:
        return self.data.draw(self.st.integers(lo, hi))

    def choice(self, seq):
        return self.data.draw(self.st.sampled_from(list(seq)))


# ------------------------------------------------------------------------------------------ corpus

def _mini_tensors(path: Path) -> dict[str, np.ndarray]:
    from converter.formats.safetensors_io import open_safetensors
    f = open_safetensors(path)
    return {n: np.array(f.get(n)) for n in f.keys() if n.startswith(KEEP)}


def build_corpus(root: Path) -> list[Path]:
    """Small real cases under ``root``: each sample directory reduced to two layers (config and
    quantize_config kept), one of them also sharded with an index, a float single file, and the
    GGUF files. Returns the case paths (files or directories)."""
    from converter.formats.safetensors_io import read_header
    from converter.write.safetensors import write_safetensors
    root.mkdir(parents=True, exist_ok=True)
    cases: list[Path] = []
    for d in sorted(p for p in SAMPLES.iterdir() if p.is_dir() and (p / "model.safetensors").exists()):
        out = root / d.name
        out.mkdir(exist_ok=True)
        for j in ("config.json", "quantize_config.json"):
            if (d / j).exists():
                shutil.copy(d / j, out / j)
        meta = read_header(d / "model.safetensors").metadata
        write_safetensors(out / "model.safetensors", _mini_tensors(d / "model.safetensors"), metadata=meta)
        cases.append(out)
    # a sharded variant (two shards + index) of the GPTQ sample
    src = SAMPLES / "gptq_w4_g128_sym"
    sh = root / "gptq_sharded"
    sh.mkdir(exist_ok=True)
    for j in ("config.json", "quantize_config.json"):
        shutil.copy(src / j, sh / j)
    tensors = _mini_tensors(src / "model.safetensors")
    names = sorted(tensors)
    parts = [names[: len(names) // 2], names[len(names) // 2:]]
    wm = {}
    for i, part in enumerate(parts, 1):
        fname = f"model-{i:05d}-of-00002.safetensors"
        write_safetensors(sh / fname, {n: tensors[n] for n in part}, metadata={"format": "pt"})
        wm.update({n: fname for n in part})
    (sh / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {"total_size": int(sum(t.nbytes for t in tensors.values()))}, "weight_map": wm}, indent=2))
    cases.append(sh)
    single = root / "float_single.safetensors"
    write_safetensors(single, _mini_tensors(SAMPLES / "minilm_fp16.safetensors"), metadata={"format": "pt"})
    cases.append(single)
    for g in ("minilm_gguf_Q4_0.gguf", "minilm_llamacpp_Q4_K_M.gguf", "minilm_gguf_Q8_0.gguf"):
        shutil.copy(SAMPLES / "gguf" / g, root / g)
        cases.append(root / g)
    return cases


def copy_case(case: Path, scratch: Path) -> Path:
    """A fresh writable copy of ``case`` inside ``scratch`` (emptied first)."""
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    dst = scratch / case.name
    if case.is_dir():
        shutil.copytree(case, dst)
    else:
        shutil.copy(case, dst)
    return dst


# ------------------------------------------------------------------------------------------ mutations

def _st_split(raw: bytes) -> tuple[dict, bytes] | None:
    if len(raw) < 8:
        return None
    n = struct.unpack("<Q", raw[:8])[0]
    try:
        return json.loads(raw[8:8 + n]), raw[8 + n:]
    except ValueError:
        return None


def _st_join(header: dict, data: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def mutate_bytes(draw: Draw, raw: bytes, header_len: int) -> bytes:
    """Byte-level damage, aimed at the header ``header_len`` bytes most of the time."""
    if not raw:
        return bytes([draw.int(0, 255)])
    hi = len(raw) - 1 if draw.int(0, 9) < 3 else max(0, min(len(raw) - 1, header_len))
    pos = draw.int(0, hi)
    op = draw.choice(["flip", "byte", "u64", "u32", "truncate", "insert", "delete"])
    b = bytearray(raw)
    if op == "flip":
        b[pos] ^= 1 << draw.int(0, 7)
    elif op == "byte":
        b[pos] = draw.choice([0, 0xFF, 0x7F, 0x80, 0x20, ord("{"), ord('"'), draw.int(0, 255)])
    elif op in ("u64", "u32"):
        v = draw.choice([x for x in INTERESTING_INTS if 0 <= x < 2**64])
        packed = struct.pack("<Q", v)[: 8 if op == "u64" else 4]
        b[pos:pos + len(packed)] = packed
    elif op == "truncate":
        del b[pos:]
    elif op == "insert":
        b[pos:pos] = bytes([draw.int(0, 255)]) * draw.int(1, 16)
    else:
        del b[pos:pos + draw.int(1, 16)]
    return bytes(b)


def _same_size_dtype(dtype: str, draw: Draw) -> str:
    groups = [["U8", "I8", "BOOL", "F8_E4M3", "F8_E5M2"], ["F16", "BF16", "I16", "U16"], ["F32", "I32", "U32"],
              ["F64", "I64", "U64"]]
    for g in groups:
        if dtype in g:
            return draw.choice(g)
    return dtype


def mutate_st_header(draw: Draw, raw: bytes) -> bytes:
    """Structured damage to a safetensors header (see :func:`_mutate_st_header`); a header already
    too damaged for a structured edit gets byte damage instead."""
    try:
        return _mutate_st_header(draw, raw)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError):
        return mutate_bytes(draw, raw, 64)


def _mutate_st_header(draw: Draw, raw: bytes) -> bytes:
    """Structured damage to a safetensors header: entry fields, names, metadata; some keep the
    container valid (same byte size) so the damage reaches the format readers."""
    split = _st_split(raw)
    if split is None:
        return mutate_bytes(draw, raw, 64)
    header, data = split
    if not isinstance(header, dict):
        return mutate_bytes(draw, raw, 64)
    names = sorted(k for k in header if k != "__metadata__")
    op = draw.choice(["dtype_same_size", "dtype_any", "reshape_same_size", "shape_dim", "offsets", "delete",
                      "rename", "metadata", "drop_metadata", "swap_names"])
    if not names:
        return _st_join(header, data)
    name = draw.choice(names)
    entry = header[name]
    if op == "dtype_same_size":
        entry["dtype"] = _same_size_dtype(entry["dtype"], draw)
    elif op == "dtype_any":
        entry["dtype"] = draw.choice(DTYPE_NAMES)
    elif op == "reshape_same_size":
        shape = list(entry["shape"])
        if draw.int(0, 1) and len(shape) >= 2:
            shape = shape[::-1]
        elif shape:
            n = int(np.prod(shape))
            shape = draw.choice([[n], [1, n], [n, 1], shape + [1], [1] + shape])
        entry["shape"] = shape
    elif op == "shape_dim":
        shape = list(entry["shape"]) or [1]
        i = draw.int(0, len(shape) - 1)
        shape[i] = draw.choice([0, 1, shape[i] + 1, max(shape[i] - 1, 0), 2 * shape[i], 2**63, -1, 1.5, "3"])
        entry["shape"] = shape
    elif op == "offsets":
        b, e = entry["data_offsets"]
        entry["data_offsets"] = draw.choice([[e, b], [b, e + 1], [b + 1, e], [0, e - b], [b, 2**64 - 1], [b], None])
    elif op == "delete":
        del header[name]
    elif op == "rename":
        suffixes = [".qweight", ".qzeros", ".scales", ".g_idx", ".weight", ".bias", ".biases", ".SCB", ".absmax",
                    ".weight_packed", ".weight_scale", ".weight_zero_point", ".weight_shape", ".quant_map",
                    ".weight.absmax", ".weight.quant_state.bitsandbytes__nf4", ""]
        base = name.rsplit(".", 1)[0]
        new = base + draw.choice(suffixes)
        if new not in header:
            header[new] = header.pop(name)
    elif op == "metadata":
        meta = header.get("__metadata__") or {}
        meta[draw.choice(["format", "qckpt.format", "quant_method", "x"])] = draw.choice(
            ["pt", "mlx", "qckpt", "", "gptq", "{}", "{\"a\": 1"])
        header["__metadata__"] = meta
    elif op == "drop_metadata":
        header.pop("__metadata__", None)
    else:
        other = draw.choice(names)
        header[name], header[other] = header[other], header[name]
    return _st_join(header, data)


def _json_paths(obj: Any, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _json_paths(v, prefix + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:8]):
            out += _json_paths(v, prefix + (i,))
    return out


def mutate_json(draw: Draw, obj: Any, focus: str | None = "quantization_config") -> Any:
    """Delete a key, change a value's type, put huge numbers in, at a random node (``focus`` subtree
    preferred)."""
    paths = [p for p in _json_paths(obj) if p]
    if focus and draw.int(0, 2):
        focused = [p for p in paths if p and p[0] == focus]
        paths = focused or paths
    if not paths:
        return draw.choice(INTERESTING_VALUES)
    path = draw.choice(paths)
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    key = path[-1]
    op = draw.choice(["delete", "set", "set", "set", "wrap"])
    if op == "delete":
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif op == "set":
        parent[key] = draw.choice(INTERESTING_VALUES)
    else:
        parent[key] = [parent[key]]
    return obj


def mutate_index(draw: Draw, case: Path, outside: Path) -> None:
    """Damage ``model.safetensors.index.json``: bad shard names, missing shards, symlinks out."""
    ipath = case / "model.safetensors.index.json"
    try:
        idx = json.loads(ipath.read_text())
    except ValueError:
        idx = None
    if not isinstance(idx, dict) or not isinstance(idx.get("weight_map"), dict):
        ipath.write_text(json.dumps(mutate_json(draw, idx if isinstance(idx, (dict, list)) else {}, focus=None)))
        return
    wm = idx["weight_map"]
    names = sorted(wm)
    op = draw.choice(["value", "delete", "add", "not_dict", "symlink_out", "remove_shard", "dir_shard", "json"])
    name = draw.choice(names) if names else "x"
    if op == "value":
        wm[name] = draw.choice(["../model.safetensors", "/etc/passwd", "missing.safetensors", "", ".", "..",
                                "sub/model.safetensors", 3, None, "model-00002-of-00002.safetensors",
                                "model-00001-of-00002.safetensors", "config.json"])
    elif op == "delete":
        wm.pop(name, None)
    elif op == "add":
        wm["extra.weight"] = draw.choice(["model-00001-of-00002.safetensors", "nope.safetensors"])
    elif op == "not_dict":
        idx["weight_map"] = draw.choice([None, [], "x", 1])
    elif op == "symlink_out":
        outside.write_bytes(b"\0" * 64)
        if not (case / "evil.safetensors").is_symlink():
            (case / "evil.safetensors").symlink_to(outside)
        wm[name] = "evil.safetensors"
    elif op == "remove_shard":
        (case / "model-00002-of-00002.safetensors").unlink(missing_ok=True)
    elif op == "dir_shard":
        (case / "d.safetensors").mkdir(exist_ok=True)
        wm[name] = "d.safetensors"
    else:
        idx = mutate_json(draw, idx, focus=None)
    ipath.write_text(json.dumps(idx))


def mutate_case(draw: Draw, case: Path, outside: Path) -> str:
    """Apply one to three mutations to the copied case in place; returns a description."""
    done = []
    for _ in range(draw.int(1, 3)):
        if case.is_dir():
            targets = sorted(p.name for p in case.iterdir() if p.is_file() and not p.is_symlink())
            if (case / "model.safetensors.index.json").exists():
                targets.append("<index>")
            if not targets:
                break
            target = draw.choice(targets)
        else:
            target = case.name
        path = case / target if case.is_dir() else case
        if target == "<index>":
            mutate_index(draw, case, outside)
        elif target.endswith(".json"):
            try:
                obj = json.loads(path.read_text())
            except ValueError:
                obj = {}
            if draw.int(0, 9) == 0:
                path.write_text(draw.choice(["", "[", "null", "[1, 2]", '{"a": 1, "a": 2}', "1e999", "\xff"]))
            else:
                path.write_text(json.dumps(mutate_json(draw, obj, "quantization_config"
                                                       if target == "config.json" else None)))
        else:
            raw = path.read_bytes()
            if target.endswith(".safetensors") and draw.int(0, 2):
                raw = mutate_st_header(draw, raw)
            else:
                hl = 8 + struct.unpack("<Q", raw[:8])[0] if target.endswith(".safetensors") and len(raw) >= 8 else 4096
                raw = mutate_bytes(draw, raw, min(hl, len(raw)))
            path.write_bytes(raw)
        done.append(target)
    return ",".join(done)


# ------------------------------------------------------------------------------------------ exercise

def exercise(path: Path) -> dict[str, str]:
    """Read ``path`` every way a user can; returns ``{format: outcome}``.

    Each format (``None`` = auto-detect) is tried independently: load, ``inspect``, ``audit``, then
    every tensor loaded and (when quantized) dequantized. ``ConverterError`` is an expected
    outcome; any other exception propagates to the caller (a bug). For GGUF files the bounded
    pre-check runs too, and when it passes ``gguf.GGUFReader`` must not fail either.
    """
    from converter.ops.audit import audit
    from converter.formats.registry import formats, load
    from converter.ops.inspect import inspect
    outcomes: dict[str, str] = {}
    if path.suffix == ".gguf":
        from converter.formats.gguf.bounds import check_gguf_bounds
        try:
            check_gguf_bounds(path)
        except ConverterError as exc:
            outcomes["gguf_bounds"] = type(exc).__name__
        else:
            import gguf
            outcomes["gguf_bounds"] = "ok"
            reader = gguf.GGUFReader(path)
            for t in reader.tensors:
                np.asarray(t.data).sum()
    for fmt in [None, *sorted(formats())]:
        key = fmt or "auto"
        try:
            ckpt = load(path, format=fmt)
            inspect(ckpt)
            audit(ckpt)
            for _, t in ckpt.items():
                if hasattr(t, "dequantize"):
                    t.dequantize()
        except MalformedInputError as exc:  # the safety net caught a reader bug: report the original
            raise exc.__cause__ from None
        except ConverterError as exc:
            outcomes[key] = type(exc).__name__
        else:
            outcomes[key] = "ok"
    return outcomes
