"""Every human rendering of a qckpt report (rich tables, text lines) and the JSON dump; above ops and validate."""
