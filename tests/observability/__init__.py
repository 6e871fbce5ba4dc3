"""Tests of traces, metrics and the observers a client reports to."""
