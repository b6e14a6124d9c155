from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_checkpoints"


def write_native_as_is(path, tensors, config):
    """A native file holding exactly ``tensors`` and ``config``, without the writers' tie rule.

    Models a third-party checkpoint that carries a redundant ``lm_head.weight`` next to
    ``tie_word_embeddings: true`` (qckpt's own writers store such a head once).
    """
    import json

    from converter.formats import native
    from converter.formats.plan import write_single_file
    from converter.tensor import Checkpoint
    ck = Checkpoint.from_tensors(list(tensors), config=config)
    meta = {"format": "pt", native.FORMAT_KEY: "native", "qckpt.version": native.VERSION,
            "qckpt.config": json.dumps(config, sort_keys=True)}
    plans = []
    for name in ck.names():
        plan, desc = native._plan(ck, name)
        plans.append(plan)
        if desc is not None:
            meta[native.LAYOUT_PREFIX + name] = json.dumps(desc, sort_keys=True)
    write_single_file(path, plans, ck, metadata=meta)
    return path
