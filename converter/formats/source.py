"""An input path opened for reading: a safetensors file, a model directory (single file or
sharded through ``model.safetensors.index.json``), or a GGUF file.

Only headers and small JSON files are read here. Pickle-based files are refused (they can run
code when loaded). Shard names from an index must be plain file names inside the directory
(no ``..``, no absolute path, no symlink leading outside); a shard named but absent is an
error naming it and how many tensors it should hold (vLLM issue #34859, CASES.md B34).
"""

from __future__ import annotations

import json
import os
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from converter.errors import (ErrorKind, CorruptFileError, FormatError, InputNotFoundError, MissingTensorError,
                              UnsafeFormatError)
from converter.tensor import DenseTensor, StoredArray, TensorSpec
from converter.formats import foreign, hub
from converter.formats.folder import choose_gguf
from converter.formats.safetensors_io import (DuplicateKey, SafetensorsHeader, TensorInfo, no_duplicate_keys,
                                              read_header, read_tensor)
from converter.write.files import INDEX_NAME

PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl", ".pickle")
MAX_JSON_BYTES = 64 * 1024 * 1024
#: JSON files a reader interprets: never copied into an output, where they would describe the source's layout
#: (``quantization_config.json``: auto-round's standalone copy of an fp8 ``quantization_config``).
_KNOWN_JSON = ("config.json", "quantize_config.json", "quantization_config.json", INDEX_NAME)
#: Records of how the source's own bytes were made (sample_checkpoints/*/PROVENANCE.json): they would
#: misdescribe a file qckpt writes, so they are not copied through.
_SOURCE_RECORDS = ("PROVENANCE.json",)


def module_prefix(name: str) -> str:
    """``<module>`` of a ``<module>.weight`` name (the name itself when it has no ``.weight`` suffix)."""
    return name[: -len(".weight")] if name.endswith(".weight") else name


def _refuse_pickle(path: Path) -> None:
    raise UnsafeFormatError("pickle-based checkpoints are refused: loading them can execute code", file=path,
                            hint="convert it once in a trusted environment, e.g. `safetensors.torch.save_file("
                                 "torch.load(p, weights_only=True), 'model.safetensors')`")


def read_json(path: Path, *, required: bool = True) -> Any:
    """Parse a small JSON file with a size bound; raises CorruptFileError naming the file."""
    if not path.exists():
        if required:
            raise InputNotFoundError("file not found", file=path)
        return None
    if not path.is_file():
        raise CorruptFileError("not a regular file", file=path, expected="a JSON file", found="directory or device")
    size = path.stat().st_size
    if size > MAX_JSON_BYTES:
        raise CorruptFileError("JSON file too large", file=path, expected=f"<= {MAX_JSON_BYTES} bytes", found=size)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CorruptFileError(f"cannot read: {exc.strerror}", file=path) from None
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicate_keys)
    except DuplicateKey as dup:
        raise CorruptFileError("duplicate key in a JSON object: which value a loader takes depends on the loader",
                               file=path, field=dup.key, expected="each key once", found="twice",
                               hint="remove the stale copy of the key") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # ValueError: JSONDecodeError, huge ints
        raise CorruptFileError(f"not valid JSON: {str(exc)[:200]}", file=path) from None


class Source:
    """A checkpoint path opened for detection and reading.

    Attributes
    ----------
    path : Path
    kind : ``"safetensors"`` (one file), ``"directory"`` or ``"gguf"``
    files : list of Path
        The data files (shards) in index order.

    A folder whose one model is a GGUF file (or a split GGUF set: its first part) is that file; a folder
    holding a GGUF and a safetensors model is refused unless ``prefer`` (``--format``) picks one
    (:func:`converter.formats.folder.choose_gguf`).

    Raises
    ------
    InputNotFoundError, UnsafeFormatError, CorruptFileError, FormatError, UnknownFormatError
    """

    def __init__(self, path: str | os.PathLike, prefer: str | None = None, *,
                 tolerate_duplicates: bool = False) -> None:
        self.path = Path(path)
        #: A tensor stored in two shards is an error unless the caller reports it itself (validate):
        #: then the shard the index names (else the first) is read, and :attr:`duplicates` lists them.
        self.tolerate_duplicates = tolerate_duplicates
        self.duplicates: dict[str, list[Path]] = {}
        if not self.path.exists():
            cached = hub.resolve_repo_id(str(path))  # org/name[@rev]: a snapshot of the local HF cache
            if cached is None:
                parts = sorted(self.path.parent.glob(f"{self.path.stem}-00001-of-*.gguf")) \
                    if self.path.suffix.lower() == ".gguf" else []
                raise InputNotFoundError("no such file or directory", file=self.path,
                                         hint=(f"written as a split GGUF: open its first part {parts[0]}"
                                               if len(parts) == 1 else None))
            self.path = cached
        foreign.refuse_path(self.path)  # ONNX, Core ML, EXL2 ...: refused by name, before any parsing
        gguf_file = choose_gguf(self.path, prefer, INDEX_NAME) if self.path.is_dir() else None
        if gguf_file is not None:  # a folder whose one model is a GGUF (or --format gguf): that file
            self.path = gguf_file
        if self.path.is_dir():
            self.kind = "directory"
            if any(self.path.glob("*.safetensors")) or (self.path / INDEX_NAME).exists():
                pass
            elif [p for p in self.path.iterdir() if p.suffix in PICKLE_SUFFIXES]:
                _refuse_pickle(next(p for p in self.path.iterdir() if p.suffix in PICKLE_SUFFIXES))
            else:
                raise InputNotFoundError("directory holds no .safetensors file", file=self.path)
        elif self.path.suffix.lower() in PICKLE_SUFFIXES:
            _refuse_pickle(self.path)
        elif not self.path.is_file():  # a FIFO or device would block or never end
            raise CorruptFileError("not a regular file", file=self.path, expected="a file or a directory",
                                   found="special file")
        elif self.path.suffix.lower() == ".gguf" or self._magic() == b"GGUF":
            self.kind = "gguf"
        else:
            self.kind = "safetensors"

    def _magic(self) -> bytes:
        with open(self.path, "rb") as fh:
            return fh.read(4)

    def describe(self) -> str:
        """A short account of what was found (for error messages)."""
        if self.kind == "gguf":
            return "a GGUF file"
        cfg = self.config or {}
        qc = cfg.get("quantization_config")
        qc = qc if isinstance(qc, dict) else {}
        return (f"{self.kind} with {len(self.files) if self.kind != 'gguf' else 1} file(s); "
                f"quant_method={qc.get('quant_method')!r}; tensors e.g. {self.tensor_names()[:3]}")

    # -- JSON side files ----------------------------------------------------------------------
    @property
    def directory(self) -> Path:
        return self.path if self.kind == "directory" else self.path.parent

    @cached_property
    def config(self) -> dict | None:
        """``config.json`` of a model directory (None for a bare file)."""
        if self.kind != "directory":
            return None
        cfg = read_json(self.path / "config.json", required=False)
        if cfg is not None and not isinstance(cfg, dict):
            raise CorruptFileError("config.json is not a JSON object", file=self.path / "config.json",
                                   kind=ErrorKind.CONFIG_MISMATCH)
        return cfg

    @cached_property
    def quantize_config(self) -> dict | None:
        """``quantize_config.json`` (AutoGPTQ) when present."""
        if self.kind != "directory":
            return None
        qc = read_json(self.path / "quantize_config.json", required=False)
        if qc is not None and not isinstance(qc, dict):
            raise CorruptFileError("quantize_config.json is not a JSON object",
                                   file=self.path / "quantize_config.json", kind=ErrorKind.CONFIG_MISMATCH)
        return qc

    @property
    def quantization_config(self) -> dict:
        """``config.json["quantization_config"]``, else ``quantize_config.json``, else ``{}``."""
        qc = (self.config or {}).get("quantization_config")
        if isinstance(qc, dict):
            return qc
        return self.quantize_config or {}

    # -- files and headers --------------------------------------------------------------------
    @cached_property
    def index(self) -> dict | None:
        """The parsed shard index (validated), or None for unsharded inputs."""
        if self.kind != "directory" or not (self.path / INDEX_NAME).exists():
            return None
        ipath = self.path / INDEX_NAME
        idx = read_json(ipath)
        if not isinstance(idx, dict) or not isinstance(idx.get("weight_map"), dict):
            raise CorruptFileError("index has no 'weight_map' object", file=ipath, field="weight_map")
        roots = hub.link_roots(self.path)
        missing: dict[str, int] = {}
        for tname, fname in idx["weight_map"].items():
            if not isinstance(fname, str) or not fname or "/" in fname or "\\" in fname or fname in (".", "..") \
                    or os.path.isabs(fname):
                raise CorruptFileError("shard name must be a plain file name inside the checkpoint directory",
                                       file=ipath, tensor=tname, field="weight_map", found=fname)
            target = (self.path / fname)
            if target.exists() and not any(r in target.resolve().parents for r in roots):
                raise CorruptFileError("shard path leads outside the checkpoint directory", file=ipath,
                                       tensor=tname, field="weight_map", found=str(target.resolve()))
            if target.exists() and not target.is_file():
                raise CorruptFileError("shard is not a regular file", file=ipath, tensor=tname, field="weight_map",
                                       expected="a .safetensors file", found=fname)
            if not target.exists():
                missing[fname] = missing.get(fname, 0) + 1
        if missing:
            first = sorted(missing)[0]
            raise InputNotFoundError(
                f"missing shard {first} ({missing[first]} tensors)"
                + (f" and {len(missing) - 1} more" if len(missing) > 1 else ""),
                file=ipath, field="weight_map", expected="every shard named by the index on disk",
                found=", ".join(f"{k} absent" for k in sorted(missing)))
        return idx

    @cached_property
    def files(self) -> list[Path]:
        """Data files: the single file, the index's shards (first-seen order), or the dir's files."""
        if self.kind in ("safetensors", "gguf"):
            return [self.path]
        if self.index is not None:
            seen: dict[str, None] = {}
            for f in self.index["weight_map"].values():
                seen.setdefault(f, None)
            return [self.path / f for f in seen]
        files = sorted(self.path.glob("*.safetensors"))
        if len(files) > 1 and not (self.path / "model.safetensors").exists():
            gguf = sorted(p.name for p in self.path.glob("*.gguf"))
            raise FormatError("several .safetensors files but no model.safetensors.index.json", file=self.path,
                              expected=f"{INDEX_NAME} or a single model.safetensors",
                              found=[f.name for f in files],
                              hint=f"the directory holds GGUF files ({', '.join(gguf[:3])}...): pass one .gguf file"
                              if gguf else "pass one .safetensors file, or add the index")
        files = [self.path / "model.safetensors"] if (self.path / "model.safetensors").exists() else files
        roots = hub.link_roots(self.path)
        for f in files:
            hub.check_link(f, roots, what="data file")
        return files

    @cached_property
    def headers(self) -> dict[Path, SafetensorsHeader]:
        """Validated header of every data file (safetensors inputs only)."""
        if self.kind == "gguf":
            return {}
        return {f: read_header(f) for f in self.files}

    @cached_property
    def _where(self) -> dict[str, Path]:
        where: dict[str, Path] = {}
        wm = self.index["weight_map"] if self.index is not None else {}
        for f, h in self.headers.items():
            for name in h.tensors:
                if name in where:
                    if not self.tolerate_duplicates:
                        raise FormatError("tensor present in two shards", file=f, tensor=name,
                                          found=f"{where[name].name} and {f.name}",
                                          hint="`qckpt validate` lists every duplicate")
                    self.duplicates.setdefault(name, [where[name]]).append(f)
                    if wm.get(name) != f.name:
                        continue  # keep the shard the index names (else the first seen)
                where[name] = f
        if self.index is not None:
            ipath = self.path / INDEX_NAME
            for tname, fname in wm.items():
                if tname not in where:
                    raise MissingTensorError("tensor named by the index is absent from its shard",
                                             file=self.path / fname, tensor=tname, field="weight_map",
                                             expected=f"present in {fname}", found="absent")
                if where[tname].name != fname:
                    raise FormatError("index names the wrong shard", file=ipath, tensor=tname, field="weight_map",
                                      expected=where[tname].name, found=fname)
            extra = sorted(set(where) - set(wm))
            if extra:
                raise FormatError("shards hold tensors the index does not list (stale index)", file=ipath,
                                  field="weight_map", found=extra[:5])
        return where

    def tensor_names(self) -> list[str]:
        """All stored tensor names, in file order."""
        return list(self._where)

    def has(self, name: str) -> bool:
        return name in self._where

    def info(self, name: str) -> TensorInfo:
        """Header entry of a stored tensor; MissingTensorError if absent."""
        try:
            f = self._where[name]
        except KeyError:
            raise MissingTensorError("tensor not found", file=self.path, tensor=name) from None
        return self.headers[f].tensors[name]

    def file_of(self, name: str) -> Path:
        self.info(name)
        return self._where[name]

    def read(self, name: str) -> np.ndarray:
        """The stored array (read-only memory map)."""
        f = self.file_of(name)
        return read_tensor(self.headers[f], name)

    def stored_array(self, name: str, role: str, part: str | None = None) -> StoredArray:
        """The header facts of stored tensor ``name`` (dtype, shape, nbytes, file name) in ``role``; ``part``:
        the format's own name for it (:class:`converter.spec.StoredArray`)."""
        info = self.info(name)
        return StoredArray(name, role, info.dtype, tuple(info.shape), info.nbytes, self.file_of(name).name, part)

    def dense_spec(self, name: str) -> TensorSpec:
        """Header-only spec of a pass-through (dense) stored tensor under its stored name."""
        info = self.info(name)
        return TensorSpec(name, "dense", tuple(info.shape), (self.stored_array(name, "dense"),), dtype=info.dtype)

    def dense(self, name: str) -> DenseTensor:
        """Pass-through tensor ``name``; its data stay the read-only memory map of :meth:`read`."""
        return DenseTensor(name, self.read(name))

    @property
    def st_metadata(self) -> dict[str, str]:
        """``__metadata__`` of the first data file."""
        return dict(self.headers[self.files[0]].metadata) if self.files and self.kind != "gguf" else {}

    def extra_files(self) -> list[Path]:
        """Other files of a model directory (tokenizer, generation config ...), to copy through."""
        if self.kind != "directory":
            return []
        skip = {f.name for f in self.files} | set(_KNOWN_JSON) | set(_SOURCE_RECORDS)
        roots = hub.link_roots(self.path)
        # regular files only (no FIFOs); a symlink leading outside the directory (or, in the Hugging Face
        # cache, outside the repository's blobs/) is refused by name, never followed
        out = sorted(p for p in self.path.iterdir() if p.is_file() and p.name not in skip
                     and not p.name.startswith(".") and p.suffix not in PICKLE_SUFFIXES + (".safetensors",))
        for p in out:
            hub.check_link(p, roots, what="side file")
        return out
