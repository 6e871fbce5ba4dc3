"""Management commands of the ``cyclone`` app."""
