"""Writing a split GGUF: the parts llama.cpp's converter writes with ``--split-max-size`` / ``--split-max-tensors``.

Conventions (gguf-py 0.19 ``GGUFWriter``, as ``convert_hf_to_gguf.py --split-max-size N`` uses it; the same keys as
llama.cpp's ``tools/gguf-split/gguf-split.cpp``):

- Tensors are taken in write order; a new part starts before a tensor when the current part already holds at
  least one tensor and either holds ``split_max_tensors`` tensors or its tensor bytes plus this tensor's would
  exceed ``split_max_size`` (bytes of tensor data, unpadded; key/values and padding not counted). A tensor larger
  than the limit is alone in its part; a tensor is never cut.
- Part ``i`` (0-based) of ``n`` is ``<stem>-{i+1:05d}-of-{n:05d}.gguf`` (gguf-py ``SHARD_NAME_FORMAT``, llama.cpp
  ``llama_split_path``), beside the requested ``<stem>.gguf``. When everything fits in one part the output is the
  one file ``<stem>.gguf`` without ``split.*`` keys (``GGUFWriter.format_shard_names``).
- Every key/value of the model is in the first part only, followed by ``split.no`` (UINT16, ``i``),
  ``split.count`` (UINT16, ``n``) and ``split.tensors.count`` (INT32, tensors of all parts); every later part holds
  only these three keys.
- Tensor data is aligned to 32 bytes in every part: parts after the first carry no ``general.alignment``, so
  llama.cpp reads them with the default (a custom alignment is written 32 in a split output).

Here the write plan is cut with :func:`split_parts` (the rule above), the header and key/values of every part are
written by ``GGUFWriter`` itself given the same limits (its cut is checked against ours), tensors are pwritten into
the parts staged in a temporary directory (:func:`converter.write.atomic.atomic_outputs`), and before anything is
renamed the staged set is read back by qckpt's split reader (:func:`check_staged`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from converter.errors import FormatError
from converter.formats.gguf.schemes import gguf_module

__all__ = ["split_parts", "part_paths_for", "check_staged"]


def split_parts(nbytes: Sequence[int], max_size: int = 0, max_tensors: int = 0) -> list[list[int]]:
    """Indices of the tensors (write order) in each part, cut as ``GGUFWriter.add_tensor_info`` cuts them.

    Parameters
    ----------
    nbytes : sequence of int
        Each tensor's data bytes (unpadded), in write order.
    max_size : int
        Bytes of tensor data per part; 0: no size limit.
    max_tensors : int
        Tensors per part; 0: no count limit.

    Returns
    -------
    list of list of int
        One list per part (one part when no limit is reached), each non-empty unless there are no tensors.
    """
    parts: list[list[int]] = [[]]
    size = 0
    for i, n in enumerate(nbytes):
        if parts[-1] and ((max_tensors and len(parts[-1]) >= max_tensors) or (max_size and size + n > max_size)):
            parts.append([])
            size = 0
        parts[-1].append(i)
        size += int(n)
    return parts


def part_paths_for(dst: Path, n_parts: int) -> list[Path]:
    """The files of an output of ``n_parts`` parts requested as ``dst``: ``[dst]`` for one, else
    ``<stem>-00001-of-0000N.gguf`` ... beside it."""
    if n_parts <= 1:
        return [Path(dst)]
    fmt = gguf_module().SHARD_NAME_FORMAT
    return [Path(dst).with_name(fmt.format(Path(dst).stem, i + 1, n_parts)) for i in range(n_parts)]


def check_staged(first: Path, want: dict[str, str], n_parts: int) -> None:
    """The staged parts, read by qckpt's split reader from ``first``, are one checkpoint of ``n_parts`` files holding
    exactly the tensors ``want`` (GGUF name -> ggml type).

    Raises
    ------
    FormatError
        Naming the first part and what differs (a bug in the writer: nothing is renamed into place).
    """
    from converter.formats.gguf.reader import read_gguf
    from converter.formats.source import Source
    ckpt = read_gguf(Source(first, prefer="gguf"))
    split = (ckpt.metadata or {}).get("gguf_split") or {}
    files = split.get("files") or [first.name]
    got_types = ckpt.metadata.get("ggml_types") or {}
    got = {ckpt.metadata["gguf_names"][n]: got_types[n] for n in ckpt.names()}
    if len(files) != n_parts or got != want:
        missing = sorted(set(want) - set(got))[:3]
        extra = sorted(set(got) - set(want))[:3]
        raise FormatError("the written GGUF parts do not read back as the planned checkpoint", file=first,
                          field="split.count", expected=f"{n_parts} parts, {len(want)} tensors",
                          found=f"{len(files)} parts, {len(got)} tensors (missing {missing}, unplanned {extra}, "
                                f"types differ: {sorted(k for k in want if k in got and got[k] != want[k])[:3]})")
