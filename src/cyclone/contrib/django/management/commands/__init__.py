"""``manage.py cyclone``."""
