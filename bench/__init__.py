"""Cyclone's benchmarks, measured against the raw-PostgreSQL limit on the same machine.

``python -m bench.jobs`` is the job-engine benchmark: it measures the raw limit with
pgbench and the scripts of ``bench/raw-postgres`` (:mod:`bench.raw`), then Cyclone's
enqueue rates, no-op throughput with worker processes and wake latency, and prints
each Cyclone figure next to its raw limit, the ratio and the target. Every run works in
throwaway databases it creates and drops, and writes its figures to
``bench/results/jobs-<timestamp>.json``.

Modules:

* :mod:`bench.jobs`: the command and the Cyclone measurements, with
  :mod:`bench.jobs_report` (medians of the repeats, the table), :mod:`bench.drain` (the
  no-op drain), :mod:`bench.retained` (retained terminal runs written before a drain),
  :mod:`bench.wake` (Cyclone's wake probe and the raw one) and :mod:`bench.cpu` (server
  CPU time of the backends);
* :mod:`bench.dag`: the static-DAG benchmark, no-op workflow steps against standalone
  jobs, and the submit time of a 1,000-node DAG (``python -m bench.dag``);
* :mod:`bench.dag_app`: its workflows and worker processes; :mod:`bench.dag_report`: its
  report;
* :mod:`bench.compare`: Cyclone beside Procrastinate and PgQueuer (``--grid``: each at
  its best setting);
* :mod:`bench.bloat`: steady load while a foreign transaction holds the xmin horizon
  (``python -m bench.bloat``), with :mod:`bench.steady` (the load, the samples and the
  holder), :mod:`bench.recovery` (baseline and recovery, pure) and
  :mod:`bench.bloat_report` (the per-window table and the summary);
* :mod:`bench.scale`: no-op jobs/s of 1, 2, 4 worker hosts (network namespaces) on one
  throwaway server, with the server's CPU beside it (``python -m bench.scale``, as
  root; it borrows :mod:`tests.netns` and :mod:`tests.throwaway`), and
  :mod:`bench.procstat` (CPU time of a process tree from ``/proc``);
* :mod:`bench.raw`: the pgbench runs (also ``python -m bench.raw`` on its own);
* :mod:`bench.workers`: the worker processes (started with multiprocessing, spawn);
* :mod:`bench.fleet`: starting them together at a barrier and stopping them;
* :mod:`bench.db`: throwaway databases, connection strings and the PgBouncer of
  ``--pooler``;
* :mod:`bench.report`: results files, percentiles, tables and the profile summary.
"""
