"""``python -m converter`` is the ``qckpt`` command."""

from .cli import main

main(prog_name="qckpt")
