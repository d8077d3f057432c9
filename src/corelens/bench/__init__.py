"""Benchmarks of corelens's performance targets (benchmarks/README.md)."""

from corelens.bench.memory import PeakRSS, max_rss_mb, rss_bytes

__all__ = ["PeakRSS", "max_rss_mb", "rss_bytes"]
