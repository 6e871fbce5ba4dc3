"""The scale-out benchmark's pure pieces: /proc stat parsing, the server's CPU over its
process tree, the median of repeats, where throughput stops growing, the pool budget."""

from __future__ import annotations

import os

import pytest
from bench.procstat import ProcStat, own_ticks, parse_stat, read_stats, tree_ticks
from bench.scale import connection_budget, median_figures, saturated_at

from cyclone.sizing import ENGINE_RESERVE

# pid 812, comm "postgres: bench (x) idle", ppid 800, utime 40, stime 9, cutime 3, cstime 1
LINE = (
    "812 (postgres: bench (x) idle) S 800 812 812 0 -1 4194560 917 0 0 0 "
    "40 9 3 1 20 0 1 0 5396 222142464 3125 18446744073709551615"
)


def _stat(
    pid: int, ppid: int, utime: int, stime: int, cutime: int = 0, cstime: int = 0
) -> ProcStat:
    return ProcStat(pid=pid, ppid=ppid, utime=utime, stime=stime, cutime=cutime, cstime=cstime)


def test_parse_stat_counts_fields_after_a_command_name_with_spaces_and_parentheses() -> None:
    assert parse_stat(LINE) == _stat(812, 800, 40, 9, 3, 1)


@pytest.mark.parametrize("text", ["", "812 postgres S 800", "812 (postgres) S 800 1 2"])
def test_parse_stat_refuses_what_is_not_a_stat_line(text: str) -> None:
    with pytest.raises(ValueError, match="not a /proc/<pid>/stat line"):
        parse_stat(text)


def test_read_stats_finds_this_process_and_its_parent() -> None:
    mine = {s.pid: s for s in read_stats()}[os.getpid()]
    assert mine.ppid == os.getppid()


def test_tree_ticks_counts_the_root_with_its_reaped_children_and_the_live_children() -> None:
    stats = [
        _stat(800, 1, 10, 5, cutime=30, cstime=7),  # the postmaster; exited backends: 37
        _stat(812, 800, 40, 9, cutime=100, cstime=100),  # a backend (its own cutime: not ours)
        _stat(813, 800, 2, 1),  # another child
        _stat(900, 812, 1000, 1000),  # a grandchild: not counted while it runs
        _stat(950, 1, 500, 500),  # someone else
    ]
    assert tree_ticks(stats, 800) == (10 + 5 + 30 + 7) + (40 + 9) + (2 + 1)
    assert tree_ticks(stats, 4242) == 0


def test_tree_ticks_keeps_a_child_that_exited_between_two_readings() -> None:
    before = [_stat(800, 1, 10, 0), _stat(812, 800, 40, 9)]
    # 812 ran 6 more ticks, exited and was waited for: its whole time moves to cutime
    after = [_stat(800, 1, 10, 0, cutime=45, cstime=10)]
    assert tree_ticks(after, 800) - tree_ticks(before, 800) == 6


def test_own_ticks_counts_only_the_named_processes() -> None:
    stats = [_stat(1, 0, 5, 5, cutime=99), _stat(2, 1, 3, 4), _stat(3, 1, 100, 100)]
    assert own_ticks(stats, [1, 2, 77]) == 17


def test_median_figures_takes_each_figure_apart() -> None:
    samples = [
        {"hosts": 2, "jobs_per_s": 100.0, "server_cores": 0.9},
        {"hosts": 2, "jobs_per_s": 300.0, "server_cores": 0.7},
        {"hosts": 2, "jobs_per_s": 200.0, "server_cores": 0.5},
    ]
    assert median_figures(samples) == {"hosts": 2, "jobs_per_s": 200.0, "server_cores": 0.7}
    with pytest.raises(ValueError, match="at least one sample"):
        median_figures([])


def test_saturated_at_names_the_first_count_that_gains_under_ten_percent() -> None:
    assert saturated_at({4: 4_100.0, 1: 3_000.0, 2: 4_000.0}) == 4
    assert saturated_at({1: 3_000.0, 2: 3_100.0, 4: 6_000.0}) == 2
    assert saturated_at({1: 1_000.0, 2: 1_900.0, 4: 3_500.0}) is None
    assert saturated_at({1: 1_000.0}) is None


def test_connection_budget_is_each_hosts_client_budget_plus_the_drivers() -> None:
    assert connection_budget(4, 20) == 4 * (20 + ENGINE_RESERVE) + 10
