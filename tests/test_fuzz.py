"""Property-based fuzzing of every reader (bounded for CI; ``fuzz/fuzz_readers.py`` runs long).

Each example copies a small real checkpoint, mutates it (bytes, safetensors header fields,
config.json / quantize_config.json / index JSON, shard files) and reads it through
``converter.load`` (auto-detect) and every registered format, loading and dequantizing every
tensor. Only the project's errors may escape (see :func:`fuzz.harness.exercise`).
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz.harness import HypothesisDraw, build_corpus, copy_case, exercise, mutate_case

_counter = itertools.count()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


def test_corpus_reads_cleanly(corpus):
    for case in corpus:
        out = exercise(case)
        if case.suffix == ".gguf":
            assert out["gguf_bounds"] == "ok"
        else:
            assert out["auto"] == "ok", (case.name, out)


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_inputs_raise_only_converter_errors(corpus, tmp_path, data):
    draw = HypothesisDraw(data)
    case = copy_case(draw.choice(corpus), tmp_path / f"work{next(_counter)}")
    mutate_case(draw, case, tmp_path / "outside.bin")
    exercise(case)  # raises anything that is not a ConverterError


@settings(max_examples=40, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_cli_on_mutated_inputs_one_line_exit_3(corpus, tmp_path, data):
    """``inspect`` / ``audit`` / ``dequantize`` on damaged input: exit 0 or 3, never a traceback;
    on error exactly one line and no output left behind."""
    from click.testing import CliRunner

    from converter.cli import main
    draw = HypothesisDraw(data)
    work = tmp_path / f"cli{next(_counter)}"
    case = copy_case(draw.choice([c for c in corpus if c.suffix != ".gguf"]), work)
    mutate_case(draw, case, tmp_path / "outside.bin")
    cmd = draw.choice([["inspect"], ["audit"], ["dequantize", "DST"]])
    dst = work / "dst"
    args = [cmd[0], str(case)] + ([str(dst)] if len(cmd) > 1 else [])
    r = CliRunner().invoke(main, args)
    assert r.exit_code in (0, 3), (args, r.output, r.exception)
    assert "Traceback" not in r.output
    if r.exit_code == 3:
        lines = [ln for ln in r.output.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("qckpt: error: "), r.output
        assert not dst.exists() and not [p for p in work.iterdir() if ".qckpt-tmp-" in p.name]
