"""Metric sinks: jsonl, console progress, Prometheus exporter (optional). Do-nothing default."""

from geodml.metrics.sinks import ConsoleProgress, JsonlSink, MultiSink, NullSink, Sink

__all__ = ["Sink", "NullSink", "JsonlSink", "ConsoleProgress", "MultiSink"]
