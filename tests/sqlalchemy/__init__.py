"""The SQLAlchemy 2 integration: *_tx calls on sessions and connections, and the
completion session of handlers."""
