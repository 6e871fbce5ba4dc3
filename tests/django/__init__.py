"""The Django integration (:mod:`cyclone.contrib.django`), proven on a small project:
``project`` (settings, urls, the worker's client) and ``shop`` (one model, written
through the ORM in completion transactions)."""
