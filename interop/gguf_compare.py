"""Two GGUF files compared key by key and tensor by tensor (gguf-py's reader), for the GGUF interop scripts."""

from __future__ import annotations

from pathlib import Path


def compare_gguf(ours: Path, theirs: Path) -> dict:
    """Key/values (value and GGUF type) and tensors (name, ggml type, bytes) of two GGUF files: ``keys`` /
    ``tensors`` (counts in ``theirs``), ``keys_differing``, ``tensor_names_differing`` (in one file only) and
    ``tensors_differing`` (same name, another type or other bytes)."""
    import gguf
    import numpy as np
    a, b = gguf.GGUFReader(ours), gguf.GGUFReader(theirs)

    def kv(r):
        return {k: (f.contents(), [t.name for t in f.types]) for k, f in r.fields.items() if not k.startswith("GGUF.")}
    ka, kb = kv(a), kv(b)
    ta, tb = {t.name: t for t in a.tensors}, {t.name: t for t in b.tensors}
    return {"keys": len(kb), "keys_differing": sorted(k for k in set(ka) | set(kb) if ka.get(k) != kb.get(k)),
            "tensors": len(tb), "tensor_names_differing": sorted(set(ta) ^ set(tb)),
            "tensors_differing": sorted(n for n in set(ta) & set(tb) if ta[n].tensor_type != tb[n].tensor_type
                                        or not np.array_equal(np.asarray(ta[n].data).view(np.uint8),
                                                              np.asarray(tb[n].data).view(np.uint8)))}
