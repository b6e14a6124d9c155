"""Output helpers: atomic writes, path checks, hashing."""
