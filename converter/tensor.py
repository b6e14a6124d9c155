"""The logical tensor model: QuantizedTensor, DenseTensor, TensorSpec and Checkpoint.

Three shapes, three names: ``shape`` (logical, e.g. ``(out, in)``), the storage shape (as on
disk, after packing; see :class:`converter.layout.AxisMap`) and ``param_shape`` (scales and zero
points; see :class:`converter.groups.GroupMap`). Invariants are checked at construction.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence, Union

import numpy as np

from converter.double_quant import DoubleQuant
from converter.dtypes import dtype_name
from converter.errors import ErrorKind, LayoutError, MissingTensorError, UnsupportedError
from converter.groups import GroupMap
from converter.layout import AxisMap, PackedCodes, check_axes
from converter.scheme import QuantScheme, ZeroPoint
from converter.spec import KINDS, ROLES, StoredArray, TensorSpec, opaque_reason, refuse_opaque
from converter.values import dequantize

__all__ = ["DoubleQuant", "DenseTensor", "QuantizedTensor", "Tensor", "source_arrays", "spec_of", "Checkpoint",
           "StoredArray", "TensorSpec", "ROLES", "KINDS",
           "opaque_reason", "refuse_opaque"]


@dataclass(frozen=True, eq=False)
class DenseTensor:
    """An unquantized tensor passed through bit-exact (biases, norms, embeddings, float weights).

    Parameters
    ----------
    name : str
    data : ndarray, any shape, any storage dtype (F32/F16/BF16/int ...).
    """

    name: str
    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape)

    @property
    def dtype(self) -> str:
        return dtype_name(self.data.dtype)

    def dequantize(self) -> np.ndarray:
        """The values as float32 (a float tensor widened; other dtypes converted)."""
        return np.asarray(self.data, dtype=np.float32)


class _CodesField:
    """Data descriptor behind ``QuantizedTensor.codes``: a :class:`PackedCodes` is unpacked on first read.

    Readers may hand over codes still in their stored words; whoever reads ``t.codes`` gets the
    array (unpacked once, then cached), while writers with a compatible layout use ``t.packed``.
    """

    def __get__(self, obj, owner=None):
        if obj is None:  # no class-level default (dataclasses treats the field as required)
            raise AttributeError("codes")
        value = obj.__dict__["_codes"]
        if isinstance(value, PackedCodes):
            value = value.unpack()
            obj.__dict__["_codes"] = value
        return value

    def __set__(self, obj, value) -> None:
        obj.__dict__["_codes"] = value


@dataclass(frozen=True, eq=False)
class QuantizedTensor:
    """A quantized tensor in logical orientation.

    Parameters
    ----------
    name : str
        Logical (Hugging Face style) name of the weight, e.g. ``model.layers.0.mlp.up_proj.weight``.
    axes : tuple of str
        Logical axes, e.g. ``("out", "in")`` or ``("expert", "out", "in")``.
    codes : ndarray, shape ``shape``, int8 (signed scheme) or uint8 (unsigned scheme)
        One code per element, unpacked.
    scales : ndarray, shape ``group_map.param_shape(shape, axes)``, dtype ``scheme.scale_dtype``
    scheme : QuantScheme
    group_map : GroupMap
    zero_points : ndarray, shape like ``scales``, optional
        Integer zero points in the code domain (``integer`` schemes, int16) or additive biases
        (``float`` schemes, dtype of scales). ``None`` for symmetric and codebook schemes.
    double_quant : DoubleQuant, optional
        Two-level scale record (GGUF K-quants).
    global_scale : ndarray, shape ``()``, float32, optional
        The per-tensor global scale ``g`` as the file stores it, present exactly when
        ``scheme.global_scale`` names its direction (``s * g`` or ``s / g``; NVFP4). The group
        ``scales`` stay the stored ones (E4M3); :func:`converter.values.effective_scales` combines them.
    stored : dict, optional
        How the source stored it (role -> AxisMap); informational, for validators and audits.

    Raises
    ------
    LayoutError
        When shapes, dtypes or code ranges break the invariants above.
    """

    name: str
    axes: tuple[str, ...]
    codes: np.ndarray = _CodesField()
    scales: np.ndarray
    scheme: QuantScheme
    group_map: GroupMap
    zero_points: np.ndarray | None = None
    double_quant: DoubleQuant | None = None
    stored: Mapping[str, AxisMap] = field(default_factory=dict)
    global_scale: np.ndarray | None = None

    def __post_init__(self) -> None:
        try:
            self._check()
        except LayoutError as exc:
            exc.with_context(tensor=self.name)
            raise

    def _check(self) -> None:
        axes = check_axes(self.axes)
        object.__setattr__(self, "axes", axes)
        codes = self.__dict__["_codes"]
        if codes.ndim != len(axes):
            raise LayoutError("codes rank differs from the axes", field="codes", expected=len(axes),
                              found=codes.ndim)
        s = self.scheme
        if codes.dtype != s.code_dtype:
            raise LayoutError("codes dtype does not match the scheme", field="codes",
                              expected=str(s.code_dtype), found=str(codes.dtype))
        if isinstance(codes, PackedCodes):  # b-bit fields hold only in-range codes
            if codes.bits != s.bits:
                raise LayoutError("packed code width differs from the scheme", field="codes",
                                  expected=s.bits, found=codes.bits)
        elif codes.size and s.bits < 8:
            lo, hi = int(codes.min()), int(codes.max())
            if lo < s.qmin or hi > s.qmax:
                raise LayoutError("codes outside the scheme's range", field="codes",
                                  expected=f"[{s.qmin}, {s.qmax}]", found=f"[{lo}, {hi}]")
        self.group_map.check_shape(codes.shape, axes)
        pshape = self.group_map.param_shape(codes.shape, axes)
        if tuple(self.scales.shape) != pshape:
            raise LayoutError("scales shape does not match the group map", field="scales",
                              expected=list(pshape), found=list(self.scales.shape), kind=ErrorKind.SHAPE)
        if self.scales.dtype != s.scale_np_dtype:
            raise LayoutError("scales dtype does not match the scheme", field="scales",
                              expected=s.scale_dtype, found=str(self.scales.dtype))
        g = self.global_scale
        if (g is None) != (s.global_scale is None):
            raise LayoutError("a global scale is stored exactly when the scheme names its direction",
                              field="global_scale", expected=s.global_scale or "none",
                              found="none" if g is None else "an array")
        if g is not None and (g.shape != () or g.dtype != np.float32):
            raise LayoutError("the global scale is one float32 value", field="global_scale",
                              expected="float32 shape ()", found=f"{g.dtype} {list(g.shape)}")
        zp = self.zero_points
        if s.zero_point is ZeroPoint.NONE:
            if zp is not None:
                raise LayoutError("symmetric scheme with zero points", field="zero_points",
                                  expected="none", found=list(zp.shape))
        else:
            if zp is None:
                raise LayoutError("scheme needs zero points", field="zero_points", expected=list(pshape),
                                  found="none")
            if tuple(zp.shape) != pshape:
                raise LayoutError("zero points shape does not match the group map", field="zero_points",
                                  expected=list(pshape), found=list(zp.shape), kind=ErrorKind.SHAPE)
            if s.zero_point is ZeroPoint.INTEGER:
                if zp.dtype.kind not in "iu":
                    raise LayoutError("integer zero points must be integers", field="zero_points",
                                      found=str(zp.dtype))
                if zp.size and (int(zp.min()) < s.qmin or int(zp.max()) > s.qmax):
                    raise LayoutError("zero points outside the code range", field="zero_points",
                                      expected=f"[{s.qmin}, {s.qmax}]", found=f"[{int(zp.min())}, {int(zp.max())}]",
                                      kind=ErrorKind.ZERO_POINT_RANGE)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.__dict__["_codes"].shape)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def packed(self) -> PackedCodes | None:
        """The codes still in their stored words (None once unpacked, or when given as an array)."""
        value = self.__dict__["_codes"]
        return value if isinstance(value, PackedCodes) else None

    def dequantize(self, dtype=None) -> np.ndarray:
        """Reconstructed values: float32 (or rounded once to the numpy float ``dtype``), shape ``shape``
        (named by ``axes``); see :func:`converter.values.dequantize` for the formula."""
        return dequantize(self, dtype)

    def replace(self, **changes: Any) -> "QuantizedTensor":
        """A copy with ``changes``; codes still packed stay packed."""
        changes.setdefault("codes", self.__dict__["_codes"])
        return dataclasses.replace(self, **changes)


Tensor = Union[QuantizedTensor, DenseTensor]


def source_arrays(t: Tensor) -> list:
    """The (possibly memory-mapped) arrays a tensor reads lazily, for :func:`converter.runtime.drop_pages`."""
    if isinstance(t, DenseTensor):
        return [t.data]
    raw = t.__dict__["_codes"]
    return [raw.words] if isinstance(raw, PackedCodes) else [raw]


def spec_of(t: Tensor, stored: Sequence[StoredArray] | None = None) -> TensorSpec:
    """Spec of an in-memory tensor (stored arrays default to its logical arrays)."""
    if isinstance(t, DenseTensor):
        st = stored or (StoredArray(t.name, "dense", t.dtype, t.shape, int(t.data.nbytes)),)
        return TensorSpec(t.name, "dense", t.shape, tuple(st), dtype=t.dtype)
    if stored is None:
        bits = t.numel * t.scheme.bits
        st = [StoredArray(t.name + ".codes", "codes", f"U{t.scheme.bits}", t.shape, -(-bits // 8)),
              StoredArray(t.name + ".scales", "scales", t.scheme.scale_dtype, tuple(t.scales.shape),
                          int(t.scales.nbytes))]
        if t.zero_points is not None:
            st.append(StoredArray(t.name + ".zero_points", "zero_points", dtype_name(t.zero_points.dtype),
                                  tuple(t.zero_points.shape), int(t.zero_points.nbytes)))
        if t.global_scale is not None:
            st.append(StoredArray(t.name + ".global_scale", "global_scale", "F32", (), 4))
        if t.group_map.g_idx is not None:
            st.append(StoredArray(t.name + ".g_idx", "g_idx", "I32", tuple(t.group_map.g_idx.shape),
                                  int(t.group_map.g_idx.nbytes)))
        stored = st
    gm = t.group_map
    return TensorSpec(t.name, "quantized", t.shape, tuple(stored), axes=t.axes, scheme=t.scheme,
                      group_map=GroupMap(gm.granularity, gm.axis, gm.group_size, block=gm.block),
                      act_order=gm.g_idx is not None,
                      double_quant=t.double_quant.kind if t.double_quant is not None else None)


class Checkpoint:
    """A set of tensors (quantized and dense) with their source format and metadata.

    Tensors are materialised on demand, one at a time (``ckpt[name]``), so a reader can stream a
    large checkpoint: specs come from headers, data from memory maps.

    Parameters
    ----------
    specs : mapping of name -> TensorSpec, in a stable order.
    loader : callable(name) -> QuantizedTensor | DenseTensor
    format : str
        Registered format name of the source (``"gptq"``, ``"native"``, ``"plain"`` ...).
    path : str, optional
        The file or directory read.
    config : dict, optional
        The model's ``config.json`` (or equivalent), unmodified.
    metadata : dict, optional
        Format-level facts (``checkpoint_format``, versions, GGUF key/values ...).
    files : tuple of str
        Data files read (shards), for audits.
    extra_files : tuple of str
        Other files of a model directory (tokenizer ...), copied by directory writers.
    side_files : mapping of file name -> callable() -> bytes, optional
        Side files the source carries in another form (a GGUF's tokenizer and chat template as
        ``tokenizer.json`` / ``tokenizer_config.json``), made on demand and written by directory
        writers beside the tensors unless a copied ``extra_files`` entry has the same name.
    aliases : mapping of alias -> name, optional
        Other names a tensor is known by in its source (a GGUF file's llama.cpp names, ``blk.0.attn_q.weight``,
        for the Hugging Face names the reader gives its tensors). ``ckpt[alias]``, ``ckpt.spec(alias)`` and
        ``alias in ckpt`` resolve to the named tensor (whose ``.name`` is its own name, not the alias);
        :meth:`names` lists the names only. An alias that is also a name is ignored (the name wins).
    row_blocks : callable(name, values_only) -> iterator or None, optional
        A loader that can produce some tensors as row blocks, never whole (:meth:`row_blocks`).
    """

    def __init__(self, specs: Mapping[str, TensorSpec], loader: Callable[[str], Tensor], *, format: str,
                 path: str | None = None, config: Mapping[str, Any] | None = None,
                 metadata: Mapping[str, Any] | None = None, files: Sequence[str] = (),
                 extra_files: Sequence[str] = (),
                 side_files: Mapping[str, Callable[[], bytes]] | None = None,
                 aliases: Mapping[str, str] | None = None,
                 row_blocks: Callable[[str], Any] | None = None) -> None:
        self._specs = dict(specs)
        self._row_blocks = row_blocks
        self.aliases = {a: n for a, n in (aliases or {}).items() if a not in self._specs and n in self._specs}
        self._loader = loader
        self.format = format
        self.path = path
        self.config = dict(config or {})
        self.metadata = dict(metadata or {})
        self.files = tuple(files)
        self.extra_files = tuple(extra_files)
        self.side_files = dict(side_files or {})

    @classmethod
    def from_tensors(cls, tensors: Sequence[Tensor], *, format: str = "memory", **kwargs: Any) -> "Checkpoint":
        """An in-memory checkpoint of already materialised tensors."""
        by_name = {t.name: t for t in tensors}
        if len(by_name) != len(tensors):
            raise LayoutError("duplicate tensor names", field="name")
        specs = {t.name: spec_of(t) for t in tensors}
        return cls(specs, by_name.__getitem__, format=format, **kwargs)

    def names(self) -> list[str]:
        return list(self._specs)

    def resolve(self, name: str) -> str:
        """The tensor's name for ``name`` or one of its :attr:`aliases` (``name`` itself when neither)."""
        return name if name in self._specs else self.aliases.get(name, name)

    def spec(self, name: str) -> TensorSpec:
        try:
            return self._specs[self.resolve(name)]
        except KeyError:
            raise MissingTensorError("no such tensor", file=self.path, tensor=name) from None

    def specs(self) -> list[TensorSpec]:
        return list(self._specs.values())

    def __contains__(self, name: object) -> bool:
        return name in self._specs or name in self.aliases

    def __len__(self) -> int:
        return len(self._specs)

    def __getitem__(self, name: str) -> Tensor:
        self._check_loadable(self.spec(name))
        return self._loader(self.resolve(name))

    def row_blocks(self, name: str, *, values_only: bool = False) -> "Iterator[tuple[int, Tensor]] | None":
        """Tensor ``name`` as consecutive row blocks ``(r0, rows r0: of it)`` in row order, when the loader can
        produce it so without holding it whole (what loading it reports is reported after the last block;
        ``values_only``: the caller uses the blocks alone, e.g. a proof: the loader may compute and report
        nothing else); None: load it with ``ckpt[name]``."""
        self._check_loadable(self.spec(name))
        return None if self._row_blocks is None else self._row_blocks(self.resolve(name), values_only)

    def _check_loadable(self, spec: TensorSpec) -> None:
        if spec.kind == "opaque" and not spec.decoded_by:
            raise UnsupportedError(f"cannot load or dequantize: {opaque_reason(spec)}", file=self.path,
                                   tensor=spec.name, field="dtype", expected="a type qckpt decodes", found=spec.dtype)

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def items(self) -> Iterator[tuple[str, Tensor]]:
        """Yield ``(name, tensor)`` one at a time, loading each on demand."""
        for name, spec in self._specs.items():
            self._check_loadable(spec)
            yield name, self._loader(name)

    def refuse_opaque(self, target: str) -> None:
        """Raise UnsupportedError on the first ``opaque`` spec (every writer calls this before planning)."""
        for spec in self._specs.values():
            refuse_opaque(spec, target)

    def quantized_names(self) -> list[str]:
        return [n for n, s in self._specs.items() if s.kind == "quantized"]
