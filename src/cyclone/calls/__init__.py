"""The calls of the two clients, by concern, each an async module and its ``_sync`` twin.

* :mod:`cyclone.calls.producers`: enqueue, enqueue_many, submit (and their ``_tx``
  forms), signal, wakeup tracking;
* :mod:`cyclone.calls.runs`: inspection (get, list, wait, stats), operator control
  (cancel, pause, resume, retry) and the purge;
* :mod:`cyclone.calls.schedules`: cron schedules.

Each async module's class is mixed into :class:`cyclone.Client`, its twin's into
:class:`cyclone.SyncClient`. Both drive the same plans (``producer``, ``submit``,
``signals``, ``control``, ``schedules``) and differ only in how they run statements and
announce wakeups; ``tests/unit/test_twins.py`` holds them to the same names,
parameters and documented errors.
"""
