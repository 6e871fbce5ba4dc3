"""The calls of the two clients, each written once.

* :mod:`cyclone.calls.producers`: enqueue, enqueue_many, submit (and their ``_tx``
  forms), signal, wakeup tracking;
* :mod:`cyclone.calls.runs`: inspection (get, list, stats), operator control (cancel,
  pause, resume, retry) and the purge;
* :mod:`cyclone.calls.schedules`: cron schedules;
* :mod:`cyclone.calls.queues`: pause and resume a queue.

Each call is a script (:mod:`cyclone.calls.effects`) made a method of both
:class:`cyclone.Client` and :class:`cyclone.SyncClient` by :class:`~cyclone.calls.effects.twin`:
the same parameters, checks, plans and documented errors. What differs is how the
effects are performed: :mod:`cyclone.calls.async_shell` for ``Client`` and
:mod:`cyclone.calls.sync_shell` for ``SyncClient`` (each with its own ``wait``).
"""
