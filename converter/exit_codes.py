"""Exit statuses of the ``qckpt`` command, defined once (shown in ``--help`` and the README)."""

OK = 0
FINDINGS = 1
USAGE = 2
UNREADABLE = 3

TABLE = ((OK, "success; validate: no findings"),
         (FINDINGS, "validate: findings reported (errors, or warnings with --strict)"),
         (USAGE, "usage error: bad option, destination exists without --overwrite, DST inside SRC"),
         (UNREADABLE, "input cannot be read or converted: missing, corrupt, unsupported or not representable"))


def epilog() -> str:
    return "\b\nExit status:\n" + "\n".join(f"  {code}  {text}" for code, text in TABLE)
