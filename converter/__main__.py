"""``python -m converter`` is the ``qckpt`` command."""

from converter.cli import main

main(prog_name="qckpt")
