"""converter.vocabulary: the command line's dtype aliases and granularities, defined once."""

import pytest

from converter.groups import Granularity
from converter.vocabulary import (DENSE_DTYPE_CHOICES, SCALE_DTYPE_CHOICES, float_dtype_name, granularity_of,
                                  granularity_options, group_map_for)


@pytest.mark.parametrize("name, expected", [("f16", "F16"), ("bf16", "BF16"), ("f32", "F32"), ("F16", "F16"),
                                            ("BF16", "BF16"), ("F32", "F32"), ("f64", None), ("F8_E4M3", None),
                                            ("fp16", None)])
def test_float_dtype_name(name, expected):
    assert float_dtype_name(name) == expected


def test_choices_cover_the_same_dtypes():
    assert sorted(SCALE_DTYPE_CHOICES) == sorted(DENSE_DTYPE_CHOICES) == ["bf16", "f16", "f32"]


def test_granularity_options_in_table_order():
    assert granularity_options(False, False, None) == []
    assert granularity_options(True, False, None) == ["--per-tensor"]
    assert granularity_options(False, True, 0) == ["--per-channel", "--group-size"]
    assert [granularity_of(o) for o in ("--per-tensor", "--per-channel", "--group-size")] == \
        ["tensor", "channel", "group"]


def test_group_map_for():
    t, c, g = group_map_for("tensor"), group_map_for("channel"), group_map_for("group", 32)
    assert t.granularity is Granularity.TENSOR
    assert (c.granularity, c.axis) == (Granularity.CHANNEL, "out")
    assert (g.granularity, g.axis, g.group_size, g.g_idx) == (Granularity.GROUP, "in", 32, None)


def test_help_format_lists_match_the_registry():
    from click.testing import CliRunner

    from converter.cli import main
    from converter.formats.registry import formats, writable
    from converter.vocabulary import FORMAT_NAMES, WRITABLE_FORMATS

    assert tuple(sorted(formats())) == FORMAT_NAMES
    assert tuple(writable()) == WRITABLE_FORMATS
    for cmd, names in (("convert", WRITABLE_FORMATS), ("quantize", WRITABLE_FORMATS), ("inspect", FORMAT_NAMES)):
        out = " ".join(CliRunner().invoke(main, [cmd, "--help"]).output.split())
        assert ", ".join(names) in out, cmd


def test_granularity_words_are_granularity_values():
    # the words are spelled as strings (no numpy at `qckpt --help` start-up): each must be a Granularity value
    from converter.vocabulary import FP8_GRANULARITY_OPTIONS, GRANULARITIES, GRANULARITY_OPTIONS
    words = set(GRANULARITIES) | {w for _, w in GRANULARITY_OPTIONS} | {w for _, w in FP8_GRANULARITY_OPTIONS}
    assert {Granularity(w).value for w in words} == words == {"tensor", "channel", "group", "block"}
