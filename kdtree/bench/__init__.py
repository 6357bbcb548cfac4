"""Benchmarks: timers, roofline, result schema, kernel and decode suites."""
