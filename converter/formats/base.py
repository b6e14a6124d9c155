"""The template a format fills in: the reader and writer skeleton every format shares.

Every format translates between *storage* (the arrays and config a tool writes) and the *logical*
model (:class:`~converter.tensor.QuantizedTensor`: codes ``(out, in)``, scales and zero points
per group, a :class:`~converter.scheme.QuantScheme`). What differs between formats is four
functions; the rest is this module:

``detect(src) -> Detection | None``
    Claim a :class:`~converter.formats.source.Source` from its headers and config only (never
    tensor data), with a confidence and the evidence.
``layers(src) -> {logical name: (TensorSpec, state)}``
    The config rules: read the format's config (bits, group size, symmetry, layout version ...)
    and the stored headers of each quantized module, check them against each other (raise a
    :class:`~converter.errors.FormatError` naming the field, with an
    :class:`~converter.errors.ErrorKind` when its type and field do not say what it is about)
    and return each module's spec (the stored arrays it owns in ``spec.stored``) with whatever
    the decoder needs (``state``). Every stored tensor no spec owns is read as a dense tensor.
``decode(src, spec, state) -> QuantizedTensor``
    Storage -> logical, for one module, when the tensor is asked for (lazily, one at a time).
``encode(spec) -> TensorPlan``
    Logical -> storage, for one quantized spec: the arrays to write and a function producing them
    from the tensor (:mod:`converter.write.plan`); ``None`` from ``check_target(spec)`` first, or
    the reason the format cannot hold the spec exactly.

:func:`define_format` turns them into a registered :class:`~converter.formats.registry.FormatHandler`
that reads and writes a Hugging Face model directory. Formats with more to do (GGUF's single
file, GPTQ's two configs, AWQ's group-size rule) write ``read`` and ``write`` themselves from
the same two halves of the skeleton: :func:`source_checkpoint` (the end of every reader) and
:func:`plan_tensors` / :func:`write_directory` (the body of every model-directory writer).

Adding a format
---------------
1. A module (or package, like :mod:`converter.formats.compressed_tensors`) under
   ``converter/formats/``: the storage facts as :class:`~converter.layout.AxisMap` constants
   (stored axes, packed axis, bits, word, in-word order), then the four functions above.
2. ``HANDLER = define_format(...)`` (or ``register(FormatHandler(...))``), with the handler's
   capabilities: ``check_target`` and its ``target_options``, ``keep_dense`` (which modules its
   loaders read quantized, :mod:`converter.formats.modules`), ``partial_groups``, ``float_bias``,
   ``scale_dtype``, ``validation`` hooks, ``output`` kind (see
   :class:`~converter.formats.registry.FormatHandler`). Code outside ``converter/formats/``
   asks the handler and never tests the format's name.
3. One import line in :mod:`converter.formats._builtin`.
4. Tests: a subclass of ``tests/formats/conformance.py``'s base class (round trip on
   prime-sized probes, the axis probe, real samples decoding like their tool, hostile inputs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Container, Mapping, Optional

from converter.errors import ConverterError, NotRepresentableError
from converter.formats.registry import NO_OPTIONS, Detection, FormatHandler, TargetOptions, register
from converter.formats.source import Source
from converter.tensor import Checkpoint, QuantizedTensor, Tensor, TensorSpec
from converter.write.plan import TensorPlan, dense_plan
from converter.formats.model_dir import write_model_dir
from converter.formats.activations import is_activation_scale

__all__ = ["source_checkpoint", "plan_tensors", "write_directory", "define_format", "dropped_activation_scales"]


def source_checkpoint(src: Source, fmt: str, specs: Mapping[str, TensorSpec], decode: Callable[[str], Tensor],
                      quantized: Container[str], metadata: Mapping[str, Any]) -> Checkpoint:
    """The end of every reader: a lazily loaded :class:`Checkpoint` of ``src``.

    Parameters
    ----------
    src : Source
    fmt : str
        The registered format name.
    specs : mapping of str to TensorSpec
        Every logical tensor, quantized and dense; kept sorted by name.
    decode : callable(name) -> Tensor
        Loads a tensor named in ``quantized``; every other tensor loads as stored (dense).
    quantized : container of str
    metadata : mapping
        Format-level facts (``ckpt.metadata``).
    """
    specs = dict(sorted(specs.items()))

    def load(name: str):
        if name in quantized:
            return decode(name)
        return src.dense(name)

    return Checkpoint(specs, load, format=fmt, path=str(src.path), config=src.config, metadata=dict(metadata),
                      files=[str(f) for f in src.files], extra_files=[str(p) for p in src.extra_files()])


def dropped_activation_scales(ckpt: Checkpoint, reason: str) -> dict[str, str]:
    """Source name -> ``reason`` for every static activation scale of ``ckpt``
    (:func:`converter.formats.activations.is_activation_scale`: ``input_scale`` ...), for a writer whose target has
    no place for them. The writer leaves them out of its plans and returns this mapping as ``dropped`` in its
    summary: the convert proof shows each as mode ``dropped`` with the reason (:func:`converter.ops.convert.proof_row`),
    the dequantize summary lists them; nothing is left out silently."""
    return {spec.name: reason for spec in ckpt.specs() if is_activation_scale(spec)}


def plan_tensors(ckpt: Checkpoint, encode: Callable[[TensorSpec], TensorPlan],
                 dense: Optional[Callable[[TensorSpec], TensorPlan]] = None) -> list[TensorPlan]:
    """Every tensor's plan, made before any data moves: dense tensors pass through bit-exact
    (:func:`~converter.write.plan.dense_plan`, or ``dense`` when given), each quantized spec goes
    through ``encode``."""
    dense = dense or dense_plan
    return [dense(spec) if spec.kind == "dense" else encode(spec) for spec in ckpt.specs()]


def write_directory(ckpt: Checkpoint, dst: Path, plans: list[TensorPlan], *, config: Mapping[str, Any] | None,
                    metadata: Mapping[str, str] | None = None, extra_json: Mapping[str, Any] | None = None,
                    max_shard_bytes: int | None = None, overwrite: bool = False,
                    notes: Callable[[], Mapping[str, Any]] | None = None) -> dict:
    """The body of every model-directory writer: ``plans`` written atomically with ``config.json``
    (:func:`~converter.write.plan.write_model_dir`, the source's other files copied); returns the
    summary with ``notes()``, called once the data is written (plans collect notes while their
    tensors are produced; default: each plan's notes, by source tensor, where it has any)."""
    summary = write_model_dir(Path(dst), plans, ckpt, metadata={"format": "pt"} if metadata is None else metadata,
                              config=config, extra_json=extra_json, extra_files=ckpt.extra_files,
                              max_shard_bytes=max_shard_bytes, overwrite=overwrite)
    summary["notes"] = dict(notes()) if notes is not None else {p.source: p.notes for p in plans if p.notes}
    return summary


def define_format(name: str, description: str, *, detect: Callable[[Source], Optional[Detection]],
                  layers: Callable[[Source], Mapping[str, tuple[TensorSpec, Any]]],
                  decode: Callable[[Source, TensorSpec, Any], QuantizedTensor],
                  encode: Optional[Callable[[TensorSpec], TensorPlan]] = None,
                  config: Optional[Callable[[Checkpoint], dict]] = None,
                  check_target: Optional[Callable[[TensorSpec, TargetOptions], Optional[str]]] = None,
                  metadata: Optional[Callable[[Source, Mapping[str, Any]], Mapping[str, Any]]] = None,
                  dense: Optional[Callable[[Checkpoint, TensorSpec], TensorPlan]] = None,
                  **capabilities: Any) -> FormatHandler:
    """Register a model-directory format made of its four functions (see the module docstring).

    ``encode`` and ``config`` (the ``config.json`` to write, default the source's) make it
    writable; ``check_target`` refuses, before any data moves, a spec it cannot hold.
    ``metadata(src, layers)`` adds format-level facts to ``ckpt.metadata``; ``dense(ckpt, spec)``
    plans a dense tensor the target stores under its own name or shape (default: passed through).
    A plan written under another name is listed in the summary's ``renamed`` ({source: written}).
    ``capabilities`` are the other :class:`FormatHandler` fields.
    """
    def read(src: Source) -> Checkpoint:
        found = layers(src)
        owned = {s.name for spec, _ in found.values() for s in spec.stored}
        specs = {n: src.dense_spec(n) for n in src.tensor_names() if n not in owned}
        specs.update({n: spec for n, (spec, _) in found.items()})
        meta = {"format": name, **(metadata(src, found) if metadata is not None else {})}
        return source_checkpoint(src, name, specs, lambda n: decode(src, found[n][0], found[n][1]), found, meta)

    def target(spec: TensorSpec, options: TargetOptions = NO_OPTIONS) -> str | None:
        return check_target(spec, options) if check_target is not None else None

    def write(ckpt: Checkpoint, dst: Path, *, overwrite: bool = False, max_shard_bytes: int | None = None,
              **_: Any) -> dict:
        ckpt.refuse_opaque(name)

        def plan(spec: TensorSpec) -> TensorPlan:
            reason = target(spec)
            if reason:
                raise NotRepresentableError(f"cannot write as {name}: {reason}", tensor=spec.name, field="scheme")
            try:
                return encode(spec)
            except ConverterError as exc:
                exc.with_context(file=ckpt.path, tensor=spec.name)
                raise
        plans = plan_tensors(ckpt, plan, None if dense is None else lambda spec: dense(ckpt, spec))
        summary = write_directory(ckpt, dst, plans, config=config(ckpt) if config is not None else ckpt.config,
                                  max_shard_bytes=max_shard_bytes, overwrite=overwrite)
        renamed = {p.source: p.outputs[0][0] for p in plans
                   if ckpt.spec(p.source).kind == "dense" and p.outputs[0][0] != p.source}
        if renamed:
            summary["renamed"] = renamed  # the convert proof reads these back under the written name
        return summary

    return register(FormatHandler(name, description, detect, read, write if encode is not None else None,
                                  check_target=target, **capabilities))
