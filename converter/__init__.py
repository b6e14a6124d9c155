"""qckpt: read, convert, validate and audit quantized checkpoints through an explicit layout."""
