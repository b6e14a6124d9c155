from pathlib import Path

import pytest

from converter.errors import MalformedInputError
from tests.synthetic import Shape, build_gptq

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_checkpoints"

#: A two-layer Llama-shaped GPTQ checkpoint (tests/synthetic.py) for streaming / proof tests.
TINY = Shape(layers=2, hidden=256, mlp=384, vocab=300, group=64)


@pytest.fixture(scope="session")
def gptq_dir(tmp_path_factory):
    """The TINY synthetic GPTQ directory (read-only: tests write their outputs elsewhere)."""
    d = tmp_path_factory.mktemp("synth") / "gptq"
    build_gptq(d, TINY, seed=3)
    return d


def write_native_as_is(path, tensors, config):
    """A native file holding exactly ``tensors`` and ``config``, without the writers' tie rule.

    Models a third-party checkpoint that carries a redundant ``lm_head.weight`` next to
    ``tie_word_embeddings: true`` (qckpt's own writers store such a head once).
    """
    import json

    from converter.formats import native
    from converter.write.files import write_single_file
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



def pytest_configure(config):
    config.addinivalue_line("markers", "malformed_ok: the test provokes MalformedInputError on purpose "
                                       "(the registry's safety net is what it tests)")


@pytest.fixture(autouse=True)
def _no_hidden_reader_bugs(request, monkeypatch):
    """Fail any test during which the registry's safety net wrapped a foreign exception.

    MalformedInputError is a FormatError (so a ConverterError): ``pytest.raises(FormatError)`` or
    ``except ConverterError`` alone would accept a reader bug as the expected typed error, and such
    a test could never fail. Tests of the safety net itself are marked ``malformed_ok``.
    """
    if request.node.get_closest_marker("malformed_ok"):
        yield
        return
    seen: list[str] = []
    original = MalformedInputError.__init__

    def record(self, *args, **kwargs):
        original(self, *args, **kwargs)
        seen.append(self.render())
    monkeypatch.setattr(MalformedInputError, "__init__", record)
    yield
    if seen:
        pytest.fail(f"a reader failed on input it did not validate (MalformedInputError): {seen[0]}")
