-- Cyclone migration 1: the base schema (docs/schema.md).
--
-- Eight tables, their indexes (exact names and partial predicates), the four monitoring
-- views, and the storage parameters of the two hot tables (docs/schema.md, cyclone_runs).
-- Runs inside one transaction under the migration advisory lock (cyclone/migrate.py).

CREATE TABLE cyclone_runs (
    id             bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    workflow       text        NOT NULL,
    def_version    text        NOT NULL,
    input          jsonb,
    state          text        NOT NULL DEFAULT 'running',
    created_at     timestamptz NOT NULL DEFAULT now(),
    updated_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    deadline_at    timestamptz,
    result_node    text,
    submit_key     text,
    has_fan_out    boolean     NOT NULL DEFAULT false,
    paused_at      timestamptz,
    parent_run_id  bigint,
    parent_node_id text,
    CONSTRAINT cyclone_runs_state_check
        CHECK (state IN ('running', 'paused', 'completed', 'failed', 'cancelled'))
) WITH (fillfactor = 90,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_threshold = 1000);

CREATE TABLE cyclone_steps (
    id                 bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id             bigint      NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    node               text        NOT NULL,
    kind               text        NOT NULL,
    state              text        NOT NULL DEFAULT 'pending',
    input              jsonb,
    output             jsonb,
    input_from         text,
    queue              text        NOT NULL DEFAULT 'default',
    priority           integer     NOT NULL DEFAULT 0,
    attempt            integer     NOT NULL DEFAULT 0,
    max_attempts       integer     NOT NULL DEFAULT 5,
    scheduled_at       timestamptz NOT NULL DEFAULT now(),
    timeout            interval,
    signal_name        text,
    signal_names       text[],
    wait_for           interval,
    wait_count         integer,
    on_dep_failure     text,
    sequence_key       text,
    unique_key         text,
    parent_node        text,
    unique_until       timestamptz,
    lease_owner        text,
    lease_expiry       timestamptz,
    heartbeat_at       timestamptz,
    lease_generation   bigint      NOT NULL DEFAULT 0,
    reclaims           integer     NOT NULL DEFAULT 0,
    fan_out_parallel   integer,
    fan_out_max_bytes  bigint,
    item_of            text,
    item_index         integer,
    child_workflow     text,
    child_needs_result boolean,
    error              text,
    error_kind         text,
    panic_stack        text,
    retention          interval,
    created_at         timestamptz NOT NULL DEFAULT now(),
    started_at         timestamptz,
    completed_at       timestamptz,
    CONSTRAINT cyclone_steps_run_node_key UNIQUE (run_id, node),
    CONSTRAINT cyclone_steps_queue_check CHECK (octet_length(queue) <= 256),
    CONSTRAINT cyclone_steps_state_check CHECK (state IN (
        'pending', 'available', 'running', 'waiting_signal', 'waiting_timer',
        'waiting_child', 'paused', 'completed', 'discarded', 'cancelled')),
    CONSTRAINT cyclone_steps_max_attempts_check CHECK (max_attempts >= 1),
    CONSTRAINT cyclone_steps_on_dep_failure_check
        CHECK (on_dep_failure IS NULL OR on_dep_failure IN ('fail_run', 'cancel_branch'))
) WITH (fillfactor = 90,
        autovacuum_vacuum_scale_factor = 0.02,
        autovacuum_vacuum_threshold = 1000);

CREATE TABLE cyclone_deps (
    run_id   bigint NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    node     text   NOT NULL,
    dep_node text   NOT NULL,
    dep_type text   NOT NULL DEFAULT 'control',
    PRIMARY KEY (run_id, node, dep_node),
    CONSTRAINT cyclone_deps_dep_type_check CHECK (dep_type IN ('control', 'data'))
);

CREATE TABLE cyclone_step_inputs (
    run_id        bigint  NOT NULL,
    node          text    NOT NULL,
    slot          integer NOT NULL,
    dep_node      text    NOT NULL,
    assembly_mode text    NOT NULL DEFAULT 'tuple',
    PRIMARY KEY (run_id, node, slot),
    CONSTRAINT cyclone_step_inputs_step_fkey FOREIGN KEY (run_id, node)
        REFERENCES cyclone_steps (run_id, node) ON DELETE CASCADE,
    CONSTRAINT cyclone_step_inputs_dep_fkey FOREIGN KEY (run_id, dep_node)
        REFERENCES cyclone_steps (run_id, node) ON DELETE CASCADE,
    CONSTRAINT cyclone_step_inputs_assembly_mode_check
        CHECK (assembly_mode IN ('tuple', 'array'))
);

CREATE TABLE cyclone_signals (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id      bigint      NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    name        text        NOT NULL,
    payload     jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    consumed_by text,
    consumed_at timestamptz
);

CREATE TABLE cyclone_schedules (
    id                   text        PRIMARY KEY,
    kind                 text        NOT NULL,
    input                jsonb       NOT NULL,
    cron_spec            text        NOT NULL,
    location             text        NOT NULL DEFAULT 'Local',
    next_run_at          timestamptz NOT NULL,
    enabled              boolean     NOT NULL DEFAULT true,
    lease_owner          text,
    lease_expiry         timestamptz,
    last_run_id          bigint REFERENCES cyclone_runs (id) ON DELETE SET NULL,
    last_error           text,
    consecutive_failures integer     NOT NULL DEFAULT 0,
    max_attempts         integer     NOT NULL DEFAULT 5,
    timeout              interval,
    queue                text        NOT NULL DEFAULT 'default',
    priority             integer     NOT NULL DEFAULT 0,
    retention            interval,
    def_version          text,
    created_at           timestamptz NOT NULL DEFAULT now(),
    updated_at           timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT cyclone_schedules_queue_check CHECK (octet_length(queue) <= 256),
    CONSTRAINT cyclone_schedules_max_attempts_check CHECK (max_attempts >= 1)
);

CREATE TABLE cyclone_schedule_fires (
    schedule_id   text        NOT NULL REFERENCES cyclone_schedules (id) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    run_id        bigint      NOT NULL REFERENCES cyclone_runs (id) ON DELETE CASCADE,
    created_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (schedule_id, scheduled_for)
);

-- cyclone_schema_version is created by the migration runner before this file runs.

-- Steps: claim, recovery, waits, uniqueness, sequencing, fan-out, children.
CREATE INDEX idx_steps_claim ON cyclone_steps (queue, priority DESC, scheduled_at)
    WHERE state = 'available';
CREATE INDEX idx_steps_lease ON cyclone_steps (lease_expiry)
    WHERE state = 'running';
CREATE INDEX idx_steps_timer ON cyclone_steps (scheduled_at)
    WHERE state = 'waiting_timer';
CREATE INDEX idx_steps_signal ON cyclone_steps (run_id, signal_name)
    WHERE state = 'waiting_signal';
CREATE INDEX idx_steps_signal_timeout ON cyclone_steps (scheduled_at)
    WHERE state = 'waiting_signal' AND wait_for IS NOT NULL;
CREATE INDEX idx_steps_timeout ON cyclone_steps (started_at)
    WHERE state = 'running' AND timeout IS NOT NULL;
CREATE UNIQUE INDEX idx_steps_signal_name_unique ON cyclone_steps (run_id, signal_name)
    WHERE signal_name IS NOT NULL;
CREATE UNIQUE INDEX idx_steps_unique_active ON cyclone_steps (kind, unique_key)
    WHERE unique_key IS NOT NULL
      AND state NOT IN ('completed', 'discarded', 'cancelled');
CREATE INDEX idx_steps_sequence ON cyclone_steps (sequence_key, scheduled_at, id)
    WHERE sequence_key IS NOT NULL
      AND state NOT IN ('completed', 'discarded', 'cancelled');
CREATE INDEX idx_steps_fan_out ON cyclone_steps (run_id)
    WHERE fan_out_parallel IS NOT NULL AND state = 'pending';
CREATE INDEX idx_steps_items ON cyclone_steps (run_id, item_of, state, item_index)
    WHERE item_of IS NOT NULL;
CREATE INDEX idx_steps_waiting_child ON cyclone_steps (run_id)
    WHERE state = 'waiting_child';

-- Signals, fires, edges, inputs.
CREATE INDEX idx_signals_unconsumed ON cyclone_signals (run_id, name, id)
    WHERE consumed_by IS NULL;
CREATE INDEX idx_signals_run ON cyclone_signals (run_id);
CREATE INDEX idx_schedule_fires_run ON cyclone_schedule_fires (run_id);
CREATE INDEX idx_deps_depnode ON cyclone_deps (run_id, dep_node);
CREATE INDEX idx_step_inputs_depnode ON cyclone_step_inputs (run_id, dep_node);

-- Schedules.
CREATE INDEX idx_schedules_due ON cyclone_schedules (next_run_at)
    WHERE enabled;
CREATE INDEX idx_schedules_lease ON cyclone_schedules (lease_expiry)
    WHERE lease_expiry IS NOT NULL;

-- Runs.
CREATE INDEX idx_runs_state_id ON cyclone_runs (state, id DESC);
CREATE INDEX idx_runs_deadline ON cyclone_runs (deadline_at)
    WHERE state = 'running' AND deadline_at IS NOT NULL;
CREATE UNIQUE INDEX idx_runs_submit_key ON cyclone_runs (workflow, submit_key)
    WHERE submit_key IS NOT NULL;
CREATE UNIQUE INDEX idx_runs_parent ON cyclone_runs (parent_run_id, parent_node_id)
    WHERE parent_run_id IS NOT NULL;

-- Monitoring views (docs/schema.md, Views).
CREATE VIEW cyclone_v_runs AS
SELECT r.id,
       r.workflow,
       r.state,
       r.def_version,
       r.created_at,
       r.updated_at,
       r.finished_at,
       r.deadline_at,
       r.paused_at,
       r.parent_run_id,
       r.parent_node_id,
       coalesce(c.steps_total, 0)          AS steps_total,
       coalesce(c.steps_completed, 0)      AS steps_completed,
       coalesce(c.steps_discarded, 0)      AS steps_discarded,
       coalesce(c.steps_running, 0)        AS steps_running,
       coalesce(c.steps_waiting_signal, 0) AS steps_waiting_signal,
       coalesce(c.steps_waiting_timer, 0)  AS steps_waiting_timer
FROM cyclone_runs r
LEFT JOIN LATERAL (
    SELECT count(*)                                         AS steps_total,
           count(*) FILTER (WHERE s.state = 'completed')      AS steps_completed,
           count(*) FILTER (WHERE s.state = 'discarded')      AS steps_discarded,
           count(*) FILTER (WHERE s.state = 'running')        AS steps_running,
           count(*) FILTER (WHERE s.state = 'waiting_signal') AS steps_waiting_signal,
           count(*) FILTER (WHERE s.state = 'waiting_timer')  AS steps_waiting_timer
    FROM cyclone_steps s
    WHERE s.run_id = r.id
) c ON true;

CREATE VIEW cyclone_v_steps AS
SELECT s.id,
       s.run_id,
       s.node,
       s.kind,
       s.state,
       s.queue,
       s.priority,
       s.attempt,
       s.max_attempts,
       s.error,
       s.error_kind,
       s.panic_stack,
       s.lease_owner,
       s.lease_expiry,
       (s.state = 'running' AND s.lease_expiry < now()) AS lease_expired,
       s.heartbeat_at,
       s.reclaims,
       s.signal_name,
       s.item_of,
       s.item_index,
       s.scheduled_at,
       s.created_at,
       s.started_at,
       s.completed_at
FROM cyclone_steps s;

CREATE VIEW cyclone_v_kinds AS
SELECT s.kind,
       s.state,
       count(*) AS count,
       max(now() - s.scheduled_at)
           FILTER (WHERE s.state = 'available' AND s.scheduled_at <= now())
           AS oldest_available_age,
       count(*) FILTER (WHERE s.state = 'running' AND s.lease_expiry < now())
           AS expired_leases
FROM cyclone_steps s
GROUP BY s.kind, s.state;

CREATE VIEW cyclone_v_queues AS
SELECT s.queue,
       count(*) FILTER (WHERE s.state = 'available') AS available,
       count(*) FILTER (WHERE s.state = 'running') AS running,
       count(*) FILTER (WHERE s.state IN ('waiting_signal', 'waiting_timer', 'waiting_child'))
           AS waiting,
       max(now() - s.scheduled_at)
           FILTER (WHERE s.state = 'available' AND s.scheduled_at <= now())
           AS oldest_available_age,
       count(*) FILTER (WHERE s.state = 'running' AND s.lease_expiry < now())
           AS expired_leases
FROM cyclone_steps s
WHERE s.state NOT IN ('completed', 'discarded', 'cancelled')
GROUP BY s.queue;
