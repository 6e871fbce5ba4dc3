"""A small Django project that uses Cyclone: settings, urls and a worker client."""
