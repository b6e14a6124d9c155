"""Checkpoint formats: storage <-> the logical model, one :class:`~converter.formats.registry.FormatHandler` each.

:mod:`~converter.formats.registry` holds the handlers (detect, read, write, ``check_target``,
validation hooks); :mod:`~converter.formats.base` is the template a format fills in; every format
name and storage fact lives in this package and nowhere above it.
"""
