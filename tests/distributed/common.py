"""Shared helpers of the distributed tests: the local-pool reference run and the checks every engine passes."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from converter.cli import main
from tests.conftest import SAMPLES

#: The GPTQ sample (2.4 MB): 300 KB shards make 6 output shards of compressed-tensors.
SOURCE = SAMPLES / "gptq_w4_g128_sym"
CONVERT = ["convert", str(SOURCE), "{dst}", "--to", "compressed-tensors", "--max-shard-size", "300KB", "--quiet",
           "--workers", "2", "--json"]


def qckpt(args: list[str], dst: Path) -> tuple[int, dict | None, str]:
    """Run ``qckpt`` in this process: (exit code, the JSON document or None, output text)."""
    res = CliRunner().invoke(main, [a.replace("{dst}", str(dst)) for a in args], catch_exceptions=False)
    try:
        doc = json.loads(res.stdout)
    except ValueError:
        doc = None
    return res.exit_code, doc, res.output


def files_of(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def siblings(dst: Path) -> list[str]:
    """What a run left beside ``dst`` other than ``dst`` itself (staging, control or temp directories)."""
    return sorted(p.name for p in dst.parent.iterdir() if p.name.startswith(f".{dst.name}."))


def without_engine(doc: dict, dst: Path, ref_dst: Path) -> dict:
    """``doc`` with its engine section dropped and ``dst`` spelled as the reference run's."""
    doc = dict(doc)
    doc.pop("engine", None)
    return json.loads(json.dumps(doc).replace(str(dst), str(ref_dst)))
