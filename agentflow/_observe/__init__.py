"""Observation: the one call per observation point that feeds logs, metrics and traces, and
the metric files."""
