"""Integrations that need a third-party package, each importable only with its extra."""
