"""Benchmarks B1–B7 (``python -m benchmarks [--quick] [--only B1,B4]``); results in ``benchmarks/results``.

Each benchmark module has ``NAME``, ``TITLE`` and ``run(bench) -> dict``; ``benchmarks.common`` holds the
shared pieces (machine info, tables, the embedded ZooKeeper, statistics). See docs/benchmarks.md.
"""
