"""Pure array code below the model: packing, blocked quantize / dequantize, error sums, threads, BLAS.

numpy, ml_dtypes and threadpoolctl only (plus :mod:`converter.errors` / :mod:`converter.runtime`);
no tensor types and no format names.
"""
