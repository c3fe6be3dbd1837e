"""Benchmarks: the kernel harness, service benchmarks, A/B, profiles."""
