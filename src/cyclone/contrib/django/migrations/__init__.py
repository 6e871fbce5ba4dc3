"""Django migrations of the ``cyclone`` app: Cyclone's schema, and the models over its
views."""
