"""Mnemo's benchmark suites: throughput, latency and retrieval quality, as same-run ratios."""
