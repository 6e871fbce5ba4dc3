"""The server-CPU helpers of the benchmarks (bench/cpu.py): /proc parsing and the sums."""

from __future__ import annotations

import os
import resource

import pytest
from bench.cpu import CLOCK_TICKS, cpu_used, read_ticks, stat_ticks

# a /proc/<pid>/stat line whose command name holds spaces and parentheses; utime
# (field 14) is 1234 and stime (field 15) is 56
_LINE = (
    "4242 (postgres: a (b) c) S 1 4242 4242 0 -1 4194560 3000 0 0 0 1234 56 0 0 20 0 1 0 "
    "987654 223344 5566 18446744073709551615 1 1 0 0 0 0 0 16781312 16386 0 0 0 17 1 0 0"
)


def test_stat_ticks_counts_fields_14_and_15_after_the_command_name() -> None:
    assert stat_ticks(_LINE) == 1234 + 56


def test_stat_ticks_refuses_a_line_that_is_not_a_stat_line() -> None:
    with pytest.raises(ValueError, match="not a /proc"):
        stat_ticks("4242 postgres S 1")


def test_read_ticks_reads_this_process_as_getrusage_sees_it() -> None:
    spent = 0.0
    while spent < 0.2:  # burn CPU so that both readings are well above one tick
        usage = resource.getrusage(resource.RUSAGE_SELF)
        spent = usage.ru_utime + usage.ru_stime
    ticks = read_ticks(os.getpid())
    assert ticks is not None
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert abs(ticks / CLOCK_TICKS - (usage.ru_utime + usage.ru_stime)) < 0.1


def test_read_ticks_of_a_process_that_is_gone_is_none() -> None:
    with open("/proc/sys/kernel/pid_max") as pid_max:
        assert read_ticks(int(pid_max.read()) + 1) is None


def test_cpu_used_counts_new_backends_from_zero_and_exited_ones_to_their_last_value() -> None:
    first = {"kept": 100, "exited": 50}
    last = {"kept": 130, "exited": 70, "new": 25}  # "exited": its last value seen
    assert cpu_used(first, last) == 30 + 20 + 25
