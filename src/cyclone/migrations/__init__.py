"""SQL migration files, applied in order by cyclone.migrate."""
