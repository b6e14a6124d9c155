"""Exit statuses of the ``qckpt`` command, defined once (shown in ``--help`` and the README)."""

OK = 0
FINDINGS = 1
USAGE = 2
UNREADABLE = 3
INTERRUPTED = 130  # 128 + SIGINT, the shell's convention

TABLE = ((OK, "success; validate: no findings"),
         (FINDINGS, "validate: findings reported (errors, or warnings with --strict)"),
         (USAGE, "usage error: bad option, destination exists without --overwrite, DST inside SRC"),
         (UNREADABLE, "input cannot be read or converted: missing, corrupt, unsupported or not representable;"
                       " or the work failed (output not writable, a worker process died, the read-back proof failed:"
                       " nothing is renamed into place)"),
         (INTERRUPTED, "interrupted (Ctrl-C); no partial output left"))


def epilog() -> str:
    """The exit-status table as a click epilog (``\\b`` keeps click from rewrapping it)."""
    return "\b\nExit status:\n" + "\n".join(f"  {code:>3}  {text}" for code, text in TABLE)
