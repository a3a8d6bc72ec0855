"""Benchmarks; run them from the repository root, e.g. ``python -m bench.decoder_bench``."""
