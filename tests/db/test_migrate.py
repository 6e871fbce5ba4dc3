"""The migration against a real PostgreSQL: the schema it creates, and how it is applied.

The expected schema below is written from the documentation, not from the SQL file:
docs/schema.md, which describes the base schema of migration 1 (here called the
reference schema: tables, columns, types, NOT NULLs, defaults, keys, indexes, storage
parameters, the version table and the view columns). Migrations after the first only
add objects: each addition is in :data:`ADDITIONS`, and listed in docs/migrations.md.
The database must hold the reference objects exactly as docs/schema.md describes them,
plus the additions, and nothing else. A failure lists every difference at once.

Then the runner itself: ten processes migrating one empty database at the same time,
a second migration being a no-op, installation into a named schema, and the
``cyclone migrate`` command.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, LiteralString, NamedTuple

import psycopg
import pytest
from psycopg import errors, sql

import cyclone
from cyclone.migrate import available_migrations
from tests import guard
from tests.conftest import create_database, database_dsn, drop_database

ROOT = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------------------
# The reference schema, from docs/schema.md
# ---------------------------------------------------------------------------------------

BIGINT, INTEGER, TEXT, TEXTS = "bigint", "integer", "text", "text[]"
JSONB, BOOLEAN, INTERVAL = "jsonb", "boolean", "interval"
TIMESTAMPTZ = "timestamp with time zone"

NOT_NULL = True  # primary key, or not null in docs/schema.md
NULLABLE = False  # "null" in docs/schema.md
UNSTATED = None  # the docs do not say; not checked

NOW = "now()"


def text_default(value: str) -> str:
    """A text default as PostgreSQL prints it (``pg_get_expr``)."""
    return f"'{value}'::text"


class Col(NamedTuple):
    """A documented column: its type, nullability and (if stated) its default."""

    type: str
    not_null: bool | None
    default: str | None = None  # None: no default is documented; not checked


TABLES: dict[str, dict[str, Col]] = {
    "cyclone_runs": {
        "id": Col(BIGINT, NOT_NULL),
        "workflow": Col(TEXT, NOT_NULL),
        "def_version": Col(TEXT, NOT_NULL),
        "input": Col(JSONB, NULLABLE),
        "state": Col(TEXT, NOT_NULL, text_default("running")),
        "created_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
        "updated_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
        "finished_at": Col(TIMESTAMPTZ, NULLABLE),
        "deadline_at": Col(TIMESTAMPTZ, NULLABLE),
        "result_node": Col(TEXT, NULLABLE),
        "submit_key": Col(TEXT, NULLABLE),
        "has_fan_out": Col(BOOLEAN, UNSTATED, "false"),
        "paused_at": Col(TIMESTAMPTZ, NULLABLE),
        "parent_run_id": Col(BIGINT, NULLABLE),
        "parent_node_id": Col(TEXT, NULLABLE),
    },
    "cyclone_steps": {
        "id": Col(BIGINT, NOT_NULL),
        "run_id": Col(BIGINT, NOT_NULL),
        "node": Col(TEXT, NOT_NULL),
        "kind": Col(TEXT, NOT_NULL),
        "state": Col(TEXT, NOT_NULL, text_default("pending")),
        "input": Col(JSONB, NULLABLE),
        "output": Col(JSONB, NULLABLE),
        "input_from": Col(TEXT, NULLABLE),
        "queue": Col(TEXT, NOT_NULL, text_default("default")),
        "priority": Col(INTEGER, NOT_NULL, "0"),
        "attempt": Col(INTEGER, NOT_NULL, "0"),
        "max_attempts": Col(INTEGER, NOT_NULL, "5"),
        "scheduled_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
        "timeout": Col(INTERVAL, NULLABLE),
        "signal_name": Col(TEXT, NULLABLE),
        "signal_names": Col(TEXTS, NULLABLE),
        "wait_for": Col(INTERVAL, NULLABLE),
        "wait_count": Col(INTEGER, NULLABLE),
        "on_dep_failure": Col(TEXT, NULLABLE),
        "sequence_key": Col(TEXT, NULLABLE),
        "unique_key": Col(TEXT, NULLABLE),
        "parent_node": Col(TEXT, NULLABLE),
        "unique_until": Col(TIMESTAMPTZ, NULLABLE),
        "lease_owner": Col(TEXT, NULLABLE),
        "lease_expiry": Col(TIMESTAMPTZ, NULLABLE),
        "heartbeat_at": Col(TIMESTAMPTZ, NULLABLE),
        "lease_generation": Col(BIGINT, NOT_NULL, "0"),
        "reclaims": Col(INTEGER, UNSTATED, "0"),
        "fan_out_parallel": Col(INTEGER, NULLABLE),
        "fan_out_max_bytes": Col(BIGINT, NULLABLE),
        "item_of": Col(TEXT, NULLABLE),
        "item_index": Col(INTEGER, NULLABLE),
        "child_workflow": Col(TEXT, NULLABLE),
        "child_needs_result": Col(BOOLEAN, NULLABLE),
        "error": Col(TEXT, NULLABLE),
        "error_kind": Col(TEXT, NULLABLE),
        "panic_stack": Col(TEXT, NULLABLE),
        "retention": Col(INTERVAL, NULLABLE),
        # "created_at, started_at, completed_at ... latter two nullable".
        "created_at": Col(TIMESTAMPTZ, NOT_NULL),
        "started_at": Col(TIMESTAMPTZ, NULLABLE),
        "completed_at": Col(TIMESTAMPTZ, NULLABLE),
    },
    "cyclone_deps": {
        "run_id": Col(BIGINT, NOT_NULL),
        "node": Col(TEXT, NOT_NULL),
        "dep_node": Col(TEXT, NOT_NULL),
        "dep_type": Col(TEXT, NOT_NULL, text_default("control")),
    },
    "cyclone_step_inputs": {
        "run_id": Col(BIGINT, NOT_NULL),
        "node": Col(TEXT, NOT_NULL),
        "slot": Col(INTEGER, NOT_NULL),
        "dep_node": Col(TEXT, UNSTATED),
        "assembly_mode": Col(TEXT, UNSTATED),
    },
    "cyclone_signals": {
        "id": Col(BIGINT, NOT_NULL),
        "run_id": Col(BIGINT, UNSTATED),
        "name": Col(TEXT, UNSTATED),
        "payload": Col(JSONB, NULLABLE),
        "created_at": Col(TIMESTAMPTZ, UNSTATED),
        "consumed_by": Col(TEXT, NULLABLE),
        "consumed_at": Col(TIMESTAMPTZ, NULLABLE),
    },
    "cyclone_schedules": {
        "id": Col(TEXT, NOT_NULL),
        "kind": Col(TEXT, NOT_NULL),
        "input": Col(JSONB, NOT_NULL),
        "cron_spec": Col(TEXT, NOT_NULL),
        "location": Col(TEXT, NOT_NULL, text_default("Local")),
        "next_run_at": Col(TIMESTAMPTZ, NOT_NULL),
        "enabled": Col(BOOLEAN, NOT_NULL, "true"),
        "lease_owner": Col(TEXT, NULLABLE),
        "lease_expiry": Col(TIMESTAMPTZ, NULLABLE),
        "last_run_id": Col(BIGINT, NULLABLE),
        "last_error": Col(TEXT, NULLABLE),
        "consecutive_failures": Col(INTEGER, NOT_NULL, "0"),
        "max_attempts": Col(INTEGER, UNSTATED),
        "timeout": Col(INTERVAL, UNSTATED),
        "queue": Col(TEXT, UNSTATED),
        "priority": Col(INTEGER, UNSTATED),
        "retention": Col(INTERVAL, UNSTATED),
        "def_version": Col(TEXT, NULLABLE),
        "created_at": Col(TIMESTAMPTZ, UNSTATED),
        "updated_at": Col(TIMESTAMPTZ, UNSTATED),
    },
    "cyclone_schedule_fires": {
        "schedule_id": Col(TEXT, NOT_NULL),
        "scheduled_for": Col(TIMESTAMPTZ, NOT_NULL),
        "run_id": Col(BIGINT, NOT_NULL),
        # Its type is not written out; every other created_at of the schema is timestamptz.
        "created_at": Col(TIMESTAMPTZ, UNSTATED),
    },
    "cyclone_schema_version": {
        "version": Col(INTEGER, NOT_NULL),
        "applied_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
    },
}

# "bigint identity"; docs/schema.md says "generated always" for runs and steps.
IDENTITY: dict[tuple[str, str], set[str]] = {
    ("cyclone_runs", "id"): {"a"},
    ("cyclone_steps", "id"): {"a"},
    ("cyclone_signals", "id"): {"a", "d"},
}

PRIMARY_KEYS = {
    "cyclone_runs": ["id"],
    "cyclone_steps": ["id"],
    "cyclone_deps": ["run_id", "node", "dep_node"],
    "cyclone_step_inputs": ["run_id", "node", "slot"],
    "cyclone_signals": ["id"],
    "cyclone_schedules": ["id"],
    "cyclone_schedule_fires": ["schedule_id", "scheduled_for"],
    "cyclone_schema_version": ["version"],
}


class ForeignKey(NamedTuple):
    """A foreign key: referencing table and columns, referenced table and columns."""

    table: str
    columns: tuple[str, ...]
    ref_table: str
    ref_columns: tuple[str, ...]


# The ON DELETE action of each documented foreign key; None where the documents name no
# action. parent_run_id has no foreign key ("There is no foreign key").
FOREIGN_KEYS: dict[ForeignKey, str | None] = {
    ForeignKey("cyclone_steps", ("run_id",), "cyclone_runs", ("id",)): "CASCADE",
    ForeignKey("cyclone_deps", ("run_id",), "cyclone_runs", ("id",)): "CASCADE",
    ForeignKey("cyclone_signals", ("run_id",), "cyclone_runs", ("id",)): "CASCADE",
    ForeignKey("cyclone_schedule_fires", ("run_id",), "cyclone_runs", ("id",)): "CASCADE",
    ForeignKey("cyclone_schedule_fires", ("schedule_id",), "cyclone_schedules", ("id",)): (
        "CASCADE"
    ),
    ForeignKey("cyclone_schedules", ("last_run_id",), "cyclone_runs", ("id",)): "SET NULL",
    ForeignKey("cyclone_step_inputs", ("run_id", "node"), "cyclone_steps", ("run_id", "node")): (
        None
    ),
    ForeignKey(
        "cyclone_step_inputs", ("run_id", "dep_node"), "cyclone_steps", ("run_id", "node")
    ): None,
}

ON_DELETE = {"a": "NO ACTION", "r": "RESTRICT", "c": "CASCADE", "n": "SET NULL", "d": "SET DEFAULT"}


class Index(NamedTuple):
    """A documented index.

    ``partial``: True when the documents describe a predicate, False when they describe
    none, None when it is not clear. ``pred_has`` / ``pred_lacks``: text that the
    predicate (as ``pg_get_expr`` prints it) must / must not contain.
    """

    table: str
    columns: tuple[str, ...]
    unique: bool = False
    partial: bool | None = True
    pred_has: tuple[str, ...] = ()
    pred_lacks: tuple[str, ...] = ()


STEPS, RUNS, SIGNALS = "cyclone_steps", "cyclone_runs", "cyclone_signals"
INDEXES: dict[str, Index] = {
    "idx_steps_claim": Index(
        STEPS, ("queue", "priority DESC", "scheduled_at"), pred_has=("'available'",)
    ),
    "idx_steps_lease": Index(STEPS, ("lease_expiry",), pred_has=("'running'",)),
    "idx_steps_timer": Index(STEPS, ("scheduled_at",), pred_has=("'waiting_timer'",)),
    "idx_steps_signal": Index(STEPS, ("run_id", "signal_name"), partial=None),
    "idx_steps_signal_timeout": Index(STEPS, ("scheduled_at",)),
    "idx_steps_timeout": Index(STEPS, ("started_at",), pred_has=("'running'",)),
    "idx_steps_signal_name_unique": Index(
        STEPS, ("run_id", "signal_name"), unique=True, pred_has=("signal_name IS NOT NULL",)
    ),
    "idx_steps_unique_active": Index(STEPS, ("kind", "unique_key"), unique=True),
    "idx_steps_sequence": Index(STEPS, ("sequence_key", "scheduled_at", "id")),
    "idx_signals_unconsumed": Index(
        SIGNALS, ("run_id", "name", "id"), pred_has=("consumed_by IS NULL",)
    ),
    "idx_signals_run": Index(SIGNALS, ("run_id",), partial=False),
    "idx_schedule_fires_run": Index("cyclone_schedule_fires", ("run_id",), partial=False),
    "idx_deps_depnode": Index("cyclone_deps", ("run_id", "dep_node"), partial=False),
    "idx_step_inputs_depnode": Index("cyclone_step_inputs", ("run_id", "dep_node"), partial=False),
    "idx_schedules_due": Index("cyclone_schedules", ("next_run_at",), pred_has=("enabled",)),
    "idx_schedules_lease": Index("cyclone_schedules", ("lease_expiry",)),
    "idx_runs_state_id": Index(RUNS, ("state", "id DESC"), partial=False),
    "idx_runs_deadline": Index(RUNS, ("deadline_at",), pred_has=("'running'", "deadline_at")),
    # "unique for every run with a key, in every state".
    "idx_runs_submit_key": Index(
        RUNS,
        ("workflow", "submit_key"),
        unique=True,
        pred_has=("submit_key IS NOT NULL",),
        pred_lacks=("state",),
    ),
    "idx_steps_fan_out": Index(STEPS, ("run_id",), pred_has=("'pending'",)),
    "idx_steps_items": Index(STEPS, ("run_id", "item_of", "state", "item_index")),
    # "unique for every child run, in every state".
    "idx_runs_parent": Index(
        RUNS, ("parent_run_id", "parent_node_id"), unique=True, pred_lacks=("state",)
    ),
    "idx_steps_waiting_child": Index(STEPS, ("run_id",), pred_has=("'waiting_child'",)),
}


def listed(text: str) -> list[str]:
    """The names of a comma-separated list, as docs/schema.md writes them."""
    return [name.strip() for name in text.split(",")]


# docs/schema.md, Views: the columns, in order.
VIEWS: dict[str, list[str]] = {
    "cyclone_v_runs": listed(
        "id, workflow, state, def_version, created_at, updated_at, finished_at, deadline_at,"
        " paused_at, parent_run_id, parent_node_id, steps_total, steps_completed,"
        " steps_discarded, steps_running, steps_waiting_signal, steps_waiting_timer"
    ),
    "cyclone_v_steps": listed(
        "id, run_id, node, kind, state, queue, priority, attempt, max_attempts, error,"
        " error_kind, panic_stack, lease_owner, lease_expiry, lease_expired, heartbeat_at,"
        " reclaims, signal_name, item_of, item_index, scheduled_at, created_at, started_at,"
        " completed_at"
    ),
    "cyclone_v_kinds": listed("kind, state, count, oldest_available_age, expired_leases"),
    "cyclone_v_queues": listed(
        "queue, available, running, waiting, oldest_available_age, expired_leases"
    ),
}

STORAGE_PARAMETERS = {
    "fillfactor=90",
    "autovacuum_vacuum_scale_factor=0.02",
    "autovacuum_vacuum_threshold=1000",
}

# ---------------------------------------------------------------------------------------
# What the later migrations add (docs/migrations.md)
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Addition:
    """What one migration after the first adds: columns of existing tables by
    (table, column), new tables (their columns and primary key), indexes by name, views
    by name (their columns in order) and functions by name (their argument types, as
    ``oidvectortypes`` writes them without names, and their result type)."""

    columns: dict[tuple[str, str], Col] = field(default_factory=dict)
    tables: dict[str, dict[str, Col]] = field(default_factory=dict)
    primary_keys: dict[str, list[str]] = field(default_factory=dict)
    indexes: dict[str, Index] = field(default_factory=dict)
    views: dict[str, list[str]] = field(default_factory=dict)
    functions: dict[str, tuple[str, str]] = field(default_factory=dict)

    def names(self) -> set[str]:
        """The names docs/migrations.md lists: ``table.column``, index, view and
        function names."""
        return (
            {f"{t}.{c}" for t, c in self.columns}
            | set(self.tables)
            | set(self.indexes)
            | set(self.views)
            | set(self.functions)
        )


ADDITIONS: dict[int, Addition] = {
    2: Addition(columns={("cyclone_steps", "fan_out_max_items"): Col(INTEGER, NULLABLE)}),
    3: Addition(
        indexes={
            "idx_runs_active_children": Index(
                RUNS, ("parent_run_id",), pred_has=("parent_run_id IS NOT NULL", "'running'")
            )
        }
    ),
    4: Addition(
        columns={("cyclone_runs", "retention"): Col(INTERVAL, NULLABLE)},
        indexes={
            "idx_runs_expiry": Index(
                RUNS, ("retention", "finished_at"), pred_has=("'completed'", "'cancelled'")
            ),
            "idx_schedules_last_run": Index(
                "cyclone_schedules", ("last_run_id",), pred_has=("last_run_id IS NOT NULL",)
            ),
        },
    ),
    5: Addition(
        views={"cyclone_unmet_deps_v1": ["run_id", "node", "dep_node", "dep_step_id"]},
        functions={
            "cyclone_reached_state_v1": ("text, text", "text"),
            "cyclone_reached_at_v1": (
                "text, text, interval, timestamp with time zone, timestamp with time zone",
                "timestamp with time zone",
            ),
        },
    ),
    6: Addition(
        views={
            "cyclone_run_results_v1": listed(
                "id, workflow, state, def_version, input, result, error, created_at,"
                " updated_at, finished_at, deadline_at, paused_at, submit_key,"
                " parent_run_id, parent_node_id"
            )
        }
    ),
    7: Addition(
        indexes={
            "idx_steps_completed_brin": Index(STEPS, ("completed_at",), partial=False),
            "idx_runs_created_brin": Index(RUNS, ("created_at",), partial=False),
            "idx_runs_submit_key_any": Index(
                RUNS, ("submit_key",), pred_has=("submit_key IS NOT NULL",)
            ),
        }
    ),
    8: Addition(columns={("cyclone_runs", "traceparent"): Col(TEXT, NULLABLE)}),
    9: Addition(
        columns={
            ("cyclone_steps", "concurrency_key"): Col(TEXT, NULLABLE),
            ("cyclone_steps", "rate_key"): Col(TEXT, NULLABLE),
            ("cyclone_steps", "fairness_key"): Col(TEXT, NULLABLE),
            ("cyclone_steps", "snoozes"): Col(INTEGER, NOT_NULL, "0"),
            ("cyclone_steps", "item_keys"): Col(JSONB, NULLABLE),
        },
        tables={
            "cyclone_kind_limits": {
                "kind": Col(TEXT, NOT_NULL),
                "max_concurrency": Col(INTEGER, NULLABLE),
                "rate_count": Col(INTEGER, NULLABLE),
                "rate_per": Col("double precision", NULLABLE),
                "rate_burst": Col(INTEGER, NOT_NULL, "0"),
                "max_snoozes": Col(INTEGER, NOT_NULL, "100"),
                "written_by": Col(TEXT, NOT_NULL),
                "written_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
            },
            "cyclone_rate_buckets": {
                "kind": Col(TEXT, NOT_NULL),
                "key": Col(TEXT, NOT_NULL),
                "starts": Col(
                    "timestamp with time zone[]", NOT_NULL, "'{}'::timestamp with time zone[]"
                ),
                "tokens": Col("double precision", NULLABLE),
                "updated_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
            },
            "cyclone_queue_pauses": {
                "queue": Col(TEXT, NOT_NULL),
                "paused_at": Col(TIMESTAMPTZ, NOT_NULL, NOW),
                "paused_by": Col(TEXT, NULLABLE),
            },
        },
        primary_keys={
            "cyclone_kind_limits": ["kind"],
            "cyclone_rate_buckets": ["kind", "key"],
            "cyclone_queue_pauses": ["queue"],
        },
        indexes={
            "idx_steps_concurrency": Index(
                STEPS,
                ("kind", "concurrency_key"),
                pred_has=("'running'", "concurrency_key IS NOT NULL"),
            ),
            "idx_steps_fairness": Index(
                STEPS,
                ("queue", "fairness_key", "priority DESC", "scheduled_at"),
                pred_has=("'available'", "fairness_key IS NOT NULL"),
            ),
        },
        views={
            "cyclone_queues_v1": listed(
                "queue, available, running, waiting, oldest_available_age, expired_leases,"
                " paused, paused_at, paused_by"
            )
        },
        functions={"cyclone_item_key_v1": ("jsonb, text", "text")},
    ),
    10: Addition(columns={("cyclone_step_inputs", "input_name"): Col(TEXT, NULLABLE)}),
}

VERSIONS = [1, *ADDITIONS]
"""Every version: 1 (the reference schema), then each migration of ADDITIONS."""


def schema_tables() -> dict[str, dict[str, Col]]:
    """:data:`TABLES` with the columns of every addition."""
    tables = {table: dict(columns) for table, columns in TABLES.items()}
    for addition in ADDITIONS.values():
        tables.update({table: dict(columns) for table, columns in addition.tables.items()})
        for (table, column), col in addition.columns.items():
            tables[table][column] = col
    return tables


def schema_indexes() -> dict[str, Index]:
    """:data:`INDEXES` with the indexes of every addition."""
    indexes = dict(INDEXES)
    for addition in ADDITIONS.values():
        indexes.update(addition.indexes)
    return indexes


# ---------------------------------------------------------------------------------------
# Reading the catalog
# ---------------------------------------------------------------------------------------

Conn = psycopg.Connection[Any]


@pytest.fixture
def db(db: Conn) -> Conn:
    """The test's database without the transition guard: these tests probe the bare
    schema with rows written by hand, in states no engine move produces."""
    guard.disable(db)
    return db


def _relations(conn: Conn, schema: str, kind: str) -> set[str]:
    rows = conn.execute(
        """
        SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = %s AND c.relkind = %s AND c.relname LIKE 'cyclone\\_%%'
        """,
        (schema, kind),
    ).fetchall()
    return {row[0] for row in rows}


def column_problems(conn: Conn, schema: str) -> list[str]:
    """Differences from :data:`TABLES` with the columns of :data:`ADDITIONS`, and from
    :data:`IDENTITY`: tables, columns, types, nulls, defaults."""
    problems = []
    wanted = schema_tables()
    tables = _relations(conn, schema, "r")
    if tables != set(wanted):
        problems.append(
            f"tables: missing {sorted(set(wanted) - tables)}, extra {sorted(tables - set(wanted))}"
        )
    rows = conn.execute(
        """
        SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               pg_get_expr(d.adbin, d.adrelid), a.attidentity
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = %s AND c.relkind = 'r' AND a.attnum > 0 AND NOT a.attisdropped
        """,
        (schema,),
    ).fetchall()
    found: dict[str, dict[str, tuple[str, bool, str | None, str]]] = {}
    for table, column, type_, not_null, default, identity in rows:
        found.setdefault(table, {})[column] = (type_, not_null, default, identity)
    for table, columns in wanted.items():
        have = found.get(table, {})
        if table in tables and set(have) != set(columns):
            missing, extra = sorted(set(columns) - set(have)), sorted(set(have) - set(columns))
            problems.append(f"{table}: missing columns {missing}, extra columns {extra}")
        for column, want in columns.items():
            if column not in have:
                continue
            type_, not_null, default, identity = have[column]
            where = f"{table}.{column}"
            if type_ != want.type:
                problems.append(f"{where}: type {type_}, expected {want.type}")
            if want.not_null is not None and not_null != want.not_null:
                expected = "NOT NULL" if want.not_null else "nullable"
                problems.append(f"{where}: expected {expected}")
            if want.default is not None and default != want.default:
                problems.append(f"{where}: default {default!r}, expected {want.default!r}")
            wanted_identity = IDENTITY.get((table, column))
            if wanted_identity and identity not in wanted_identity:
                problems.append(f"{where}: identity {identity!r}, expected {wanted_identity}")
    return problems


def _constraints(conn: Conn, schema: str, contype: str) -> list[tuple[Any, ...]]:
    """(table, columns, referenced table or None, referenced columns, on-delete code, def)."""
    return conn.execute(
        """
        SELECT t.relname,
               ARRAY(SELECT a.attname FROM unnest(k.conkey) WITH ORDINALITY AS u(num, pos)
                     JOIN pg_attribute a ON a.attrelid = k.conrelid AND a.attnum = u.num
                     ORDER BY u.pos),
               CASE WHEN rn.nspname = n.nspname THEN r.relname
                    ELSE rn.nspname || '.' || r.relname END,
               ARRAY(SELECT a.attname FROM unnest(k.confkey) WITH ORDINALITY AS u(num, pos)
                     JOIN pg_attribute a ON a.attrelid = k.confrelid AND a.attnum = u.num
                     ORDER BY u.pos),
               k.confdeltype::text,
               pg_get_constraintdef(k.oid)
        FROM pg_constraint k
        JOIN pg_class t ON t.oid = k.conrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        LEFT JOIN pg_class r ON r.oid = k.confrelid
        LEFT JOIN pg_namespace rn ON rn.oid = r.relnamespace
        WHERE n.nspname = %s AND k.contype = %s AND t.relname LIKE 'cyclone\\_%%'
        """,
        (schema, contype),
    ).fetchall()


def key_problems(conn: Conn, schema: str) -> list[str]:
    """Differences in primary keys, the unique (run_id, node) of steps, and foreign keys."""
    problems = []
    primary = {row[0]: row[1] for row in _constraints(conn, schema, "p")}
    keys = dict(PRIMARY_KEYS)
    for addition in ADDITIONS.values():
        keys.update(addition.primary_keys)
    for table, columns in keys.items():
        if primary.get(table) != columns:
            problems.append(f"{table}: primary key {primary.get(table)}, expected {columns}")

    unique_node = conn.execute(
        """
        SELECT count(*) FROM pg_index x
        JOIN pg_class t ON t.oid = x.indrelid JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = %s AND t.relname = 'cyclone_steps' AND x.indisunique
          AND x.indpred IS NULL AND x.indexprs IS NULL
          AND ARRAY(SELECT a.attname FROM unnest(x.indkey::int2[]) WITH ORDINALITY u(num, pos)
                    JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = u.num
                    ORDER BY u.pos) = ARRAY['run_id', 'node']::name[]
        """,
        (schema,),
    ).fetchone()
    if not unique_node or unique_node[0] != 1:
        problems.append("cyclone_steps: no unique (run_id, node)")

    found = {
        ForeignKey(table, tuple(cols), ref, tuple(ref_cols)): ON_DELETE[action]
        for table, cols, ref, ref_cols, action, _ in _constraints(conn, schema, "f")
    }
    for fk in sorted(set(FOREIGN_KEYS) - set(found)):
        problems.append(f"missing foreign key {fk}")
    for fk in sorted(set(found) - set(FOREIGN_KEYS)):
        problems.append(f"undocumented foreign key {fk} ON DELETE {found[fk]}")
    for fk, action in FOREIGN_KEYS.items():
        if action is not None and fk in found and found[fk] != action:
            problems.append(f"{fk}: ON DELETE {found[fk]}, expected {action}")
    return problems


def index_problems(conn: Conn, schema: str) -> list[str]:
    """Differences from :data:`INDEXES` with those of :data:`ADDITIONS`; every index that
    backs no key must be documented."""
    rows = conn.execute(
        """
        SELECT i.relname, t.relname, x.indisunique, pg_get_expr(x.indpred, x.indrelid),
               ARRAY(SELECT pg_get_indexdef(x.indexrelid, k, true)
                            || CASE WHEN pg_index_column_has_property(x.indexrelid, k, 'desc')
                                    THEN ' DESC' ELSE '' END
                     FROM generate_series(1, x.indnkeyatts) AS k ORDER BY k),
               EXISTS (SELECT 1 FROM pg_constraint k
                       WHERE k.conindid = x.indexrelid AND k.conrelid = x.indrelid
                         AND k.contype IN ('p', 'u', 'x'))
        FROM pg_index x
        JOIN pg_class i ON i.oid = x.indexrelid
        JOIN pg_class t ON t.oid = x.indrelid
        JOIN pg_namespace n ON n.oid = t.relnamespace
        WHERE n.nspname = %s AND t.relname LIKE 'cyclone\\_%%'
        """,
        (schema,),
    ).fetchall()
    problems = []
    wanted = schema_indexes()
    found = {name: row for name, *row in rows}
    undocumented = {name for name, (*_, backs_key) in found.items() if not backs_key}
    for name in sorted(undocumented - set(wanted)):
        problems.append(f"undocumented index {name}")
    for name, want in wanted.items():
        if name not in found:
            problems.append(f"missing index {name}")
            continue
        table, unique, predicate, columns, _ = found[name]
        if table != want.table:
            problems.append(f"{name}: on {table}, expected {want.table}")
        if tuple(columns) != want.columns:
            problems.append(f"{name}: columns {columns}, expected {list(want.columns)}")
        if unique != want.unique:
            problems.append(f"{name}: unique={unique}, expected unique={want.unique}")
        if want.partial is not None and (predicate is not None) != want.partial:
            expected = "partial" if want.partial else "not partial"
            problems.append(f"{name}: predicate {predicate!r}, expected {expected}")
        for text in want.pred_has:
            if text not in (predicate or ""):
                problems.append(f"{name}: predicate {predicate!r} does not mention {text}")
        for text in want.pred_lacks:
            if text in (predicate or ""):
                problems.append(f"{name}: predicate {predicate!r} mentions {text}")
    return problems


def schema_views() -> dict[str, list[str]]:
    """:data:`VIEWS` with the views of every addition."""
    views = dict(VIEWS)
    for addition in ADDITIONS.values():
        views.update(addition.views)
    return views


def function_problems(conn: Conn, schema: str) -> list[str]:
    """Differences from the functions of :data:`ADDITIONS`: names, argument types,
    result types; no function besides them (a replaced one would show a new
    signature)."""
    wanted = {name: sig for a in ADDITIONS.values() for name, sig in a.functions.items()}
    rows = conn.execute(
        """
        SELECT p.proname, oidvectortypes(p.proargtypes),
               format_type(p.prorettype, NULL)
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = %s AND p.proname LIKE 'cyclone\\_%%'
        """,
        (schema,),
    ).fetchall()
    have = {name: (args, result) for name, args, result in rows}
    return [
        f"function {name}: {have.get(name)}, expected {wanted.get(name)}"
        for name in sorted(set(have) | set(wanted))
        if have.get(name) != wanted.get(name)
    ]


def view_problems(conn: Conn, schema: str) -> list[str]:
    """Differences from :data:`VIEWS` and the views of :data:`ADDITIONS`: the view
    names and their columns in order."""
    problems = []
    views = _relations(conn, schema, "v")
    wanted = schema_views()
    if views != set(wanted):
        problems.append(f"views {sorted(views)}, expected {sorted(wanted)}")
    for view, columns in wanted.items():
        rows = conn.execute(
            """
            SELECT a.attname FROM pg_attribute a
            JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s AND a.attnum > 0 AND NOT a.attisdropped
            ORDER BY a.attnum
            """,
            (schema, view),
        ).fetchall()
        have = [row[0] for row in rows]
        if view in views and have != columns:
            problems.append(f"{view}: columns {have}, expected {columns}")
    return problems


def storage_problems(conn: Conn, schema: str) -> list[str]:
    """Missing storage parameters on cyclone_runs and cyclone_steps."""
    problems = []
    for table in ("cyclone_runs", "cyclone_steps"):
        row = conn.execute(
            """
            SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %s AND c.relname = %s
            """,
            (schema, table),
        ).fetchone()
        options = set((row[0] if row else None) or [])
        if not options >= STORAGE_PARAMETERS:
            problems.append(f"{table}: reloptions {sorted(options)}, expected {STORAGE_PARAMETERS}")
    return problems


def queue_check_problems(conn: Conn, schema: str) -> list[str]:
    """Steps and schedules each need a CHECK constraint on their queue column."""
    checks = _constraints(conn, schema, "c")
    return [
        f"{table}: no CHECK constraint on queue"
        for table in ("cyclone_steps", "cyclone_schedules")
        if not any(t == table and "queue" in cols for t, cols, *_ in checks)
    ]


def reference_problems(conn: Conn, schema: str = "public") -> list[str]:
    """Every difference between ``schema`` and the reference schema plus
    :data:`ADDITIONS`."""
    return [
        *column_problems(conn, schema),
        *key_problems(conn, schema),
        *index_problems(conn, schema),
        *view_problems(conn, schema),
        *function_problems(conn, schema),
        *storage_problems(conn, schema),
        *queue_check_problems(conn, schema),
    ]


def versions(conn: Conn, schema: str = "public") -> list[int]:
    """The versions recorded in ``schema``.cyclone_schema_version, in order."""
    rows = conn.execute(
        sql.SQL("SELECT version FROM {}.cyclone_schema_version ORDER BY version").format(
            sql.Identifier(schema)
        )
    ).fetchall()
    return [row[0] for row in rows]


def catalog_snapshot(conn: Conn, schema: str = "public") -> dict[str, list[tuple[Any, ...]]]:
    """Everything a migration could change in ``schema``, with object ids (a drop and
    re-create shows) and file nodes (a rewrite shows)."""
    queries: dict[str, LiteralString] = {
        "relations": """
            SELECT c.oid::bigint, c.relname, c.relkind::text, c.relfilenode::bigint,
                   c.reloptions
            FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = %(s)s ORDER BY c.relname""",
        "columns": """
            SELECT c.relname, a.attnum, a.attname, format_type(a.atttypid, a.atttypmod),
                   a.attnotnull, pg_get_expr(d.adbin, d.adrelid)
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
            JOIN pg_namespace n ON n.oid = c.relnamespace
            LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
            WHERE n.nspname = %(s)s AND a.attnum > 0 ORDER BY 1, 2""",
        "constraints": """
            SELECT k.oid::bigint, k.conname, pg_get_constraintdef(k.oid)
            FROM pg_constraint k JOIN pg_namespace n ON n.oid = k.connamespace
            WHERE n.nspname = %(s)s ORDER BY k.conname""",
        "indexes": """
            SELECT indexname, indexdef FROM pg_indexes
            WHERE schemaname = %(s)s ORDER BY indexname""",
        "views": """
            SELECT viewname, definition FROM pg_views
            WHERE schemaname = %(s)s ORDER BY viewname""",
    }
    return {name: conn.execute(q, {"s": schema}).fetchall() for name, q in queries.items()}


def new_run(conn: Conn, **values: Any) -> int:
    """Insert a run with the given columns (workflow and def_version defaulted); its id."""
    values = {"workflow": "wf", "def_version": "v1", **values}
    query = sql.SQL("INSERT INTO cyclone_runs ({}) VALUES ({}) RETURNING id").format(
        sql.SQL(", ").join(map(sql.Identifier, values)),
        sql.SQL(", ").join(sql.Placeholder() * len(values)),
    )
    row = conn.execute(query, list(values.values())).fetchone()
    assert row is not None
    return int(row[0])


def new_schedule(conn: Conn, schedule_id: str, queue: str = "default") -> None:
    """Insert a schedule, giving every column the documents name a value."""
    conn.execute(
        """
        INSERT INTO cyclone_schedules (id, kind, input, cron_spec, location, next_run_at,
                                       enabled, max_attempts, timeout, queue, priority,
                                       retention)
        VALUES (%s, 'report', '{}', '*/5 * * * *', 'UTC', now(), true, 5,
                interval '1 minute', %s, 0, interval '7 days')
        """,
        (schedule_id, queue),
    )


def count(conn: Conn, table: str, run_id: int) -> int:
    """Rows of ``table`` that belong to run ``run_id``."""
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {} WHERE run_id = %s").format(sql.Identifier(table)),
        (run_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


# ---------------------------------------------------------------------------------------
# The migrated schema is the reference schema
# ---------------------------------------------------------------------------------------


def test_tables_and_columns_match_the_reference(db: Conn) -> None:
    """The eight tables exist with exactly the documented columns, types, NOT NULLs,
    defaults and identity columns."""
    assert column_problems(db, "public") == []


def test_primary_unique_and_foreign_keys_match_the_reference(db: Conn) -> None:
    """Primary keys, the unique (run_id, node) of steps, and every foreign key with its
    ON DELETE action; no undocumented foreign key (parent_run_id has none)."""
    assert key_problems(db, "public") == []


def test_indexes_match_the_reference(db: Conn) -> None:
    """Every index of the Indexes table by name, table, columns (DESC included),
    uniqueness and partial predicate; no undocumented index."""
    assert index_problems(db, "public") == []


def test_views_have_the_documented_columns_in_order(db: Conn) -> None:
    """The four monitoring views with the columns of docs/schema.md, in that order, and
    the views of later migrations with theirs."""
    assert view_problems(db, "public") == []


def test_functions_are_the_documented_ones(db: Conn) -> None:
    """The SQL functions of later migrations, with their argument and result types,
    and no other function."""
    assert function_problems(db, "public") == []


def test_hot_tables_have_the_storage_parameters(db: Conn) -> None:
    """fillfactor 90 and the autovacuum settings on cyclone_runs and cyclone_steps."""
    assert storage_problems(db, "public") == []


def test_schema_version_records_every_version(db: Conn) -> None:
    """cyclone_schema_version(version integer primary key, applied_at timestamptz not null
    default now()) holds versions 1 and 2, applied in the past."""
    rows = db.execute(
        "SELECT version, applied_at <= now() FROM cyclone_schema_version ORDER BY version"
    ).fetchall()
    assert rows == [(version, True) for version in VERSIONS]


def documented_additions() -> dict[int, set[str]]:
    """docs/migrations.md, its table of migrations: version -> the column
    (``table.column``) and index names its "adds" cell names in backticks."""
    text = (ROOT / "docs" / "migrations.md").read_text("utf-8")
    found: dict[int, set[str]] = {}
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].isdigit():
            continue
        names = re.findall(r"`([^`]+)`", cells[2])
        pattern = r"cyclone_\w+\.\w+|idx_\w+|cyclone_\w+_v\d+"
        tables = {t for addition in ADDITIONS.values() for t in addition.tables}
        found[int(cells[0])] = {n for n in names if re.fullmatch(pattern, n) or n in tables}
    return found


def test_every_migration_and_addition_is_listed_in_the_docs() -> None:
    """The migrations shipped are version 1 and those of ADDITIONS; docs/migrations.md
    lists each, version 1 adding no object beyond the reference and each later one
    exactly the objects of its ADDITIONS entry, nothing more or less."""
    assert [m.version for m in available_migrations()] == VERSIONS
    assert documented_additions() == {
        1: set(),
        **{version: addition.names() for version, addition in ADDITIONS.items()},
    }


def test_additions_leave_the_reference_objects_alone() -> None:
    """No addition redefines a reference column or index: they are new objects."""
    for addition in ADDITIONS.values():
        assert {key for key in addition.columns if key[1] in TABLES[key[0]]} == set()
        assert set(addition.indexes) & set(INDEXES) == set()
        assert set(addition.views) & set(VIEWS) == set()


@pytest.mark.parametrize("table", ["cyclone_steps", "cyclone_schedules"])
def test_queue_is_capped_at_256_bytes(db: Conn, table: str) -> None:
    """A CHECK constraint caps queue at 256 bytes, counting bytes, not characters."""
    assert [p for p in queue_check_problems(db, "public") if p.startswith(table)] == []
    run_id = new_run(db)
    counter = iter(range(100))

    def insert(queue: str) -> None:
        if table == "cyclone_steps":
            db.execute(
                "INSERT INTO cyclone_steps (run_id, node, kind, queue) VALUES (%s, %s, 'k', %s)",
                (run_id, f"n{next(counter)}", queue),
            )
        else:
            new_schedule(db, f"s{next(counter)}", queue)

    insert("q" * 256)
    insert("é" * 128)  # 128 characters, 256 bytes
    with pytest.raises(errors.CheckViolation):
        insert("q" * 257)
    with pytest.raises(errors.CheckViolation):
        insert("é" * 129)  # 129 characters, fewer than 256, but 258 bytes
    stored = sql.SQL("SELECT max(octet_length(queue)), count(*) FROM {}")
    row = db.execute(stored.format(sql.Identifier(table))).fetchone()
    assert row == (256, 2)


def test_deletes_follow_the_documented_foreign_key_actions(db: Conn) -> None:
    """Deleting a run (as retention does) removes its steps, deps, step inputs, signals
    and fires, and clears schedules.last_run_id; deleting a schedule removes its fires."""
    run_id = new_run(db)
    for node in ("a", "b", "c"):
        db.execute(
            "INSERT INTO cyclone_steps (run_id, node, kind) VALUES (%s, %s, 'k')", (run_id, node)
        )
    db.execute("INSERT INTO cyclone_deps (run_id, node, dep_node) VALUES (%s, 'c', 'a')", (run_id,))
    db.execute(
        """
        INSERT INTO cyclone_step_inputs (run_id, node, slot, dep_node, assembly_mode)
        VALUES (%s, 'c', 0, 'a', 'tuple'), (%s, 'c', 1, 'b', 'tuple')
        """,
        (run_id, run_id),
    )
    db.execute("INSERT INTO cyclone_signals (run_id, name) VALUES (%s, 'go')", (run_id,))
    new_schedule(db, "nightly")
    db.execute("UPDATE cyclone_schedules SET last_run_id = %s", (run_id,))
    db.execute(
        "INSERT INTO cyclone_schedule_fires (schedule_id, scheduled_for, run_id)"
        " VALUES ('nightly', now(), %s)",
        (run_id,),
    )
    default_dep_type = db.execute("SELECT dep_type FROM cyclone_deps").fetchone()
    assert default_dep_type == ("control",)

    # A step input must name existing steps, as consumer and as producer.
    for node, dep_node in (("missing", "a"), ("c", "missing")):
        with pytest.raises(errors.ForeignKeyViolation):
            db.execute(
                "INSERT INTO cyclone_step_inputs (run_id, node, slot, dep_node, assembly_mode)"
                " VALUES (%s, %s, 9, %s, 'tuple')",
                (run_id, node, dep_node),
            )

    db.execute("DELETE FROM cyclone_runs WHERE id = %s", (run_id,))
    tables = ["cyclone_steps", "cyclone_deps", "cyclone_step_inputs", "cyclone_signals"]
    assert {t: count(db, t, run_id) for t in [*tables, "cyclone_schedule_fires"]} == dict.fromkeys(
        [*tables, "cyclone_schedule_fires"], 0
    )
    assert db.execute("SELECT id, last_run_id FROM cyclone_schedules").fetchall() == [
        ("nightly", None)
    ]

    other = new_run(db)
    db.execute(
        "INSERT INTO cyclone_schedule_fires (schedule_id, scheduled_for, run_id)"
        " VALUES ('nightly', now(), %s)",
        (other,),
    )
    db.execute("DELETE FROM cyclone_schedules WHERE id = 'nightly'")
    assert count(db, "cyclone_schedule_fires", other) == 0


def test_unique_indexes_cover_the_documented_states(db: Conn) -> None:
    """submit_key is unique in every state; unique_key among active steps, paused
    included; a finished step frees its unique_key."""
    new_run(db, submit_key="order-1", state="completed")
    with pytest.raises(errors.UniqueViolation):
        new_run(db, submit_key="order-1")
    new_run(db, submit_key="order-1", workflow="other")
    new_run(db)
    new_run(db)  # runs without a key are not constrained

    run_id = new_run(db)

    def step(node: str, state: str) -> None:
        db.execute(
            "INSERT INTO cyclone_steps (run_id, node, kind, unique_key, state)"
            " VALUES (%s, %s, 'charge', 'cust-7', %s)",
            (run_id, node, state),
        )

    step("done", "completed")
    step("gone", "discarded")
    step("paused", "paused")
    with pytest.raises(errors.UniqueViolation):
        step("again", "available")


# ---------------------------------------------------------------------------------------
# Applying the migration
# ---------------------------------------------------------------------------------------


def _migrate_together(dsn: str, start: Any, results: Any, index: int) -> None:
    """A child process: wait at the barrier, migrate, report the result (or the error)."""
    start.wait(timeout=120)
    try:
        applied = cyclone.migrate(dsn)
    except BaseException as exc:
        results.put((index, f"{type(exc).__name__}: {exc}"))
        raise
    results.put((index, applied))


@pytest.mark.slow
def test_ten_processes_migrate_an_empty_database_at_once(empty_dsn: str) -> None:
    """Ten processes released together by a barrier all succeed; every version is
    applied exactly once (each file in its own locked transaction, so two processes
    may share the work), and the schema is complete."""
    workers = 10
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(workers)
    results = ctx.Queue()
    processes = [
        ctx.Process(target=_migrate_together, args=(empty_dsn, start, results, i))
        for i in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        outcomes = dict(results.get(timeout=120) for _ in processes)
    finally:
        for process in processes:
            process.join(timeout=120)
    exit_codes = [process.exitcode for process in processes]
    for process in processes:
        process.close()
    results.close()
    results.join_thread()

    assert exit_codes == [0] * workers, outcomes
    assert sorted(v for applied in outcomes.values() for v in applied) == VERSIONS, outcomes
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert versions(conn) == VERSIONS
        assert reference_problems(conn) == []


def test_second_migrate_is_a_noop(empty_dsn: str) -> None:
    """The second call returns [] and changes no catalog object; rows survive. The async
    entry point agrees."""
    assert cyclone.migrate(empty_dsn) == VERSIONS
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        run_id = new_run(conn)
        conn.execute(
            "INSERT INTO cyclone_steps (run_id, node, kind) VALUES (%s, 'a', 'k')", (run_id,)
        )
        before = catalog_snapshot(conn)
        version_rows = conn.execute("SELECT * FROM cyclone_schema_version").fetchall()

        assert cyclone.migrate(empty_dsn) == []
        assert asyncio.run(cyclone.migrate_async(empty_dsn)) == []

        assert catalog_snapshot(conn) == before
        assert conn.execute("SELECT * FROM cyclone_schema_version").fetchall() == version_rows
        assert conn.execute("SELECT id FROM cyclone_runs").fetchall() == [(run_id,)]
        assert conn.execute("SELECT run_id, node FROM cyclone_steps").fetchall() == [(run_id, "a")]


def test_migrate_into_a_named_schema(empty_dsn: str) -> None:
    """schema="cyc" puts the complete schema in cyc and nothing in public; a second call
    is a no-op."""
    assert cyclone.migrate(empty_dsn, schema="cyc") == VERSIONS
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert _relations(conn, "cyc", "r") == set(schema_tables())
        assert _relations(conn, "public", "r") | _relations(conn, "public", "v") == set()
        assert versions(conn, "cyc") == VERSIONS
        assert reference_problems(conn, "cyc") == []
        before = catalog_snapshot(conn, "cyc")

        assert cyclone.migrate(empty_dsn, schema="cyc") == []
        assert catalog_snapshot(conn, "cyc") == before
        assert versions(conn, "cyc") == VERSIONS


def test_bad_schema_name_is_rejected_and_creates_nothing(empty_dsn: str) -> None:
    """A schema name that is not a plain identifier raises ValidationError before any
    object is created."""
    objects = """
        SELECT n.nspname, c.relname FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')
        UNION ALL SELECT nspname, NULL FROM pg_namespace ORDER BY 1, 2
    """
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        before = conn.execute(objects).fetchall()
        with pytest.raises(cyclone.ValidationError):
            cyclone.migrate(empty_dsn, schema="bad-name; drop")
        with pytest.raises(cyclone.ValidationError):
            asyncio.run(cyclone.migrate_async(empty_dsn, schema="bad-name; drop"))
        assert conn.execute(objects).fetchall() == before


# ---------------------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------------------


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``python -m cyclone ARGS``, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "cyclone", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.slow
def test_cli_migrate_applies_then_reports_up_to_date(empty_dsn: str) -> None:
    """`cyclone migrate --dsn` applies every migration, saying so once on stdout (a log
    line per migration only with `--log-level debug`), then says the schema is up to
    date."""
    first = run_cli("migrate", "--dsn", empty_dsn)
    assert first.returncode == 0, first.stderr
    applied = ", ".join(str(v) for v in VERSIONS)
    assert re.search(rf"applied migrations? {applied}\b", first.stdout, re.IGNORECASE), first.stdout
    assert "applied migration" not in first.stderr

    second = run_cli("migrate", "--dsn", empty_dsn)
    assert second.returncode == 0, second.stderr
    assert "up to date" in second.stdout.lower(), second.stdout
    with psycopg.connect(empty_dsn, autocommit=True) as conn:
        assert versions(conn) == VERSIONS


def test_cli_migrate_logs_each_migration_at_debug(empty_dsn: str) -> None:
    debug = run_cli("--log-level", "debug", "migrate", "--dsn", empty_dsn)
    assert debug.returncode == 0, debug.stderr
    assert "INFO cyclone.migrate: applied migration 0001_init" in debug.stderr
    assert debug.stdout.startswith("applied migrations 1, 2")


def test_cli_migrate_in_process_leaves_the_library_log_as_it_was(
    admin_dsn: str, empty_dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """In a process whose logging is already set up (Django's ``call_command``, a
    test), the command quiets the per-migration lines only while it runs, and
    ``--log-level debug`` shows them even though ``basicConfig`` then does nothing."""
    from click.testing import CliRunner

    from cyclone.cli import main

    caplog.set_level(logging.INFO, logger="cyclone.migrate")
    quiet = CliRunner().invoke(main, ["migrate", "--dsn", empty_dsn])
    assert quiet.exit_code == 0, quiet.output
    assert not [r for r in caplog.records if r.name == "cyclone.migrate"]
    assert logging.getLogger("cyclone.migrate").level == logging.INFO
    name = create_database(admin_dsn)
    try:
        shown = CliRunner().invoke(
            main, ["--log-level", "debug", "migrate", "--dsn", database_dsn(admin_dsn, name)]
        )
    finally:
        drop_database(admin_dsn, name)
    assert shown.exit_code == 0, shown.output
    logged = [r.getMessage() for r in caplog.records if r.name == "cyclone.migrate"]
    assert "applied migration 0001_init" in logged


@pytest.mark.parametrize(
    "bad_dsn",
    [
        "host=127.0.0.1 port=1 user=postgres dbname=postgres connect_timeout=5",
        "postgresql://user@127.0.0.1:notaport/db",
    ],
    ids=["refused", "malformed"],
)
@pytest.mark.slow
def test_cli_migrate_bad_dsn_fails_with_one_line(bad_dsn: str) -> None:
    """A DSN that cannot be used: non-zero exit and a one-line error, no traceback."""
    result = run_cli("migrate", "--dsn", bad_dsn)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].strip(), result.stderr
