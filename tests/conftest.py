from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_checkpoints"

import pytest

from converter.errors import MalformedInputError


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
