-- The demo's business tables and queries (application SQL, not the engine's).
--
-- Staging tables hold the raw CSV rows of one run (keyed by run_id, so demos running
-- at once on one database never mix); the aggregate tables hold what the report reads.
-- Delays are kept as sums and counts, so that yearly means are exact.


-- name: demo_schema
-- Two demos starting at once on a new database would race on CREATE TABLE IF NOT
-- EXISTS: the transaction-scoped lock makes the second wait for the first.
SELECT pg_advisory_xact_lock(hashtext('cyclone.demo.schema'));
CREATE TABLE IF NOT EXISTS demo_flights (
    run_id bigint NOT NULL, year int, month int, day int, dep_time int,
    sched_dep_time int, dep_delay int, arr_time int, sched_arr_time int, arr_delay int,
    carrier text, flight int, tailnum text, origin text, dest text, air_time int,
    distance int, hour int, minute int, time_hour timestamptz);
CREATE INDEX IF NOT EXISTS demo_flights_run_month ON demo_flights (run_id, month);
CREATE TABLE IF NOT EXISTS demo_weather (
    run_id bigint NOT NULL, origin text, year int, month int, day int, hour int,
    temp float8, dewp float8, humid float8, wind_dir float8, wind_speed float8,
    wind_gust float8, precip float8, pressure float8, visib float8,
    time_hour timestamptz);
CREATE INDEX IF NOT EXISTS demo_weather_run_slot ON demo_weather (run_id, origin, time_hour);
CREATE TABLE IF NOT EXISTS demo_month_totals (
    run_id bigint NOT NULL, month int NOT NULL,
    per text NOT NULL CHECK (per IN ('carrier', 'origin')), key text NOT NULL,
    flights int NOT NULL, cancelled int NOT NULL,
    dep_delay_sum bigint NOT NULL, dep_delay_n int NOT NULL,
    arr_delay_sum bigint NOT NULL, arr_delay_n int NOT NULL,
    PRIMARY KEY (run_id, month, per, key));
CREATE TABLE IF NOT EXISTS demo_weather_effect (
    run_id bigint NOT NULL, origin text NOT NULL, condition text NOT NULL,
    flights int NOT NULL, mean_dep_delay float8,
    PRIMARY KEY (run_id, origin, condition));
CREATE TABLE IF NOT EXISTS demo_airlines (carrier text PRIMARY KEY, name text NOT NULL);
CREATE TABLE IF NOT EXISTS demo_reports (
    run_id bigint PRIMARY KEY, markdown text NOT NULL, chart_png bytea NOT NULL,
    figures jsonb NOT NULL, created_at timestamptz NOT NULL DEFAULT now());


-- name: demo_stage_flights
CREATE TEMP TABLE demo_flights_in (LIKE demo_flights) ON COMMIT DROP;
ALTER TABLE demo_flights_in DROP COLUMN run_id;


-- name: demo_stage_airlines
CREATE TEMP TABLE demo_airlines_in (LIKE demo_airlines) ON COMMIT DROP;


-- name: demo_stage_weather
CREATE TEMP TABLE demo_weather_in (LIKE demo_weather) ON COMMIT DROP;
ALTER TABLE demo_weather_in DROP COLUMN run_id;


-- name: demo_copy_flights
COPY demo_flights_in FROM STDIN (FORMAT csv, HEADER true, NULL 'NA');


-- name: demo_load_flights
-- This run's staged flights (the DELETE only guards against rows of an earlier load;
-- a failed load rolls back with its step) and the months found with their counts.
WITH gone AS (
    DELETE FROM demo_flights WHERE run_id = %(run_id)s
), loaded AS (
    INSERT INTO demo_flights
    SELECT %(run_id)s, i.* FROM demo_flights_in i
    RETURNING month
)
SELECT month, count(*)::int FROM loaded GROUP BY month ORDER BY month;


-- name: demo_copy_airlines
COPY demo_airlines_in FROM STDIN (FORMAT csv, HEADER true);


-- name: demo_load_airlines
INSERT INTO demo_airlines SELECT * FROM demo_airlines_in ON CONFLICT (carrier) DO NOTHING;


-- name: demo_copy_weather
COPY demo_weather_in FROM STDIN (FORMAT csv, HEADER true, NULL 'NA');


-- name: demo_load_weather
-- This run's staged observations (the rows inserted are the statement's row count).
WITH gone AS (
    DELETE FROM demo_weather WHERE run_id = %(run_id)s
)
INSERT INTO demo_weather
SELECT %(run_id)s, i.* FROM demo_weather_in i;


-- name: demo_month_totals
-- One month's flights, cancellations (no departure time) and delay sums per carrier and
-- per origin airport (per = 'carrier' or 'origin', key = the carrier or the airport),
-- from one read of the month's flights; totals computed again (a step run again)
-- replace the stored ones.
INSERT INTO demo_month_totals
SELECT %(run_id)s, month,
       CASE WHEN grouping(carrier) = 0 THEN 'carrier' ELSE 'origin' END,
       coalesce(carrier, origin),
       count(*), count(*) FILTER (WHERE dep_time IS NULL),
       coalesce(sum(dep_delay), 0), count(dep_delay),
       coalesce(sum(arr_delay), 0), count(arr_delay)
FROM demo_flights
WHERE run_id = %(run_id)s AND month = %(month)s
GROUP BY GROUPING SETS ((month, carrier), (month, origin))
ON CONFLICT (run_id, month, per, key) DO UPDATE
SET flights = excluded.flights, cancelled = excluded.cancelled,
    dep_delay_sum = excluded.dep_delay_sum, dep_delay_n = excluded.dep_delay_n,
    arr_delay_sum = excluded.arr_delay_sum, arr_delay_n = excluded.arr_delay_n
RETURNING per, flights, cancelled;


-- name: demo_weather_effect
-- Mean departure delay per origin airport under each weather condition of the hour
-- the flight was scheduled in: any precipitation or none, visibility under 3 miles
-- or not.
WITH joined AS (
    SELECT f.origin, f.dep_delay, w.precip, w.visib
    FROM demo_flights f
    JOIN demo_weather w
      ON w.run_id = f.run_id AND w.origin = f.origin AND w.time_hour = f.time_hour
    WHERE f.run_id = %(run_id)s AND f.dep_delay IS NOT NULL
), conditions AS (
    SELECT origin, CASE WHEN precip > 0 THEN 'precipitation' ELSE 'dry' END AS condition,
           dep_delay
    FROM joined WHERE precip IS NOT NULL
    UNION ALL
    SELECT origin, CASE WHEN visib < 3 THEN 'visibility < 3 mi' ELSE 'visibility >= 3 mi' END,
           dep_delay
    FROM joined WHERE visib IS NOT NULL
)
INSERT INTO demo_weather_effect
SELECT %(run_id)s, origin, condition, count(*), avg(dep_delay)
FROM conditions
GROUP BY origin, condition
ON CONFLICT (run_id, origin, condition) DO UPDATE
SET flights = excluded.flights, mean_dep_delay = excluded.mean_dep_delay
RETURNING origin, condition, flights, mean_dep_delay;


-- name: demo_drop_staging
-- The run's staged rows, once the join (their last reader) has used them.
WITH flights AS (
    DELETE FROM demo_flights WHERE run_id = %(run_id)s
)
DELETE FROM demo_weather WHERE run_id = %(run_id)s;


-- name: demo_carrier_year
-- The year per carrier: flights, cancellations, mean delays (minutes), airline name.
SELECT m.key, a.name, sum(m.flights)::int, sum(m.cancelled)::int,
       sum(m.dep_delay_sum)::float8 / nullif(sum(m.dep_delay_n), 0),
       sum(m.arr_delay_sum)::float8 / nullif(sum(m.arr_delay_n), 0)
FROM demo_month_totals m
LEFT JOIN demo_airlines a ON a.carrier = m.key
WHERE m.run_id = %(run_id)s AND m.per = 'carrier'
GROUP BY m.key, a.name
ORDER BY m.key;


-- name: demo_carrier_months
-- Mean arrival delay per carrier and month, for the chart.
SELECT key, month, arr_delay_sum::float8 / nullif(arr_delay_n, 0)
FROM demo_month_totals
WHERE run_id = %(run_id)s AND per = 'carrier'
ORDER BY key, month;


-- name: demo_origin_year
SELECT key, sum(flights)::int, sum(cancelled)::int,
       sum(dep_delay_sum)::float8 / nullif(sum(dep_delay_n), 0),
       sum(arr_delay_sum)::float8 / nullif(sum(arr_delay_n), 0)
FROM demo_month_totals
WHERE run_id = %(run_id)s AND per = 'origin'
GROUP BY key
ORDER BY key;


-- name: demo_weather_rows
SELECT origin, condition, flights, mean_dep_delay
FROM demo_weather_effect
WHERE run_id = %(run_id)s
ORDER BY origin, condition;


-- name: demo_save_report
INSERT INTO demo_reports (run_id, markdown, chart_png, figures)
VALUES (%(run_id)s, %(markdown)s, %(chart_png)s, %(figures)s::jsonb)
ON CONFLICT (run_id) DO UPDATE
SET markdown = excluded.markdown, chart_png = excluded.chart_png,
    figures = excluded.figures, created_at = now();


-- name: demo_previous_report
-- The figures of the newest report of another run (to compare a run's with).
SELECT run_id, figures FROM demo_reports
WHERE run_id <> %(run_id)s
ORDER BY created_at DESC
LIMIT 1;


-- name: demo_database_exists
-- On the server's admin database: whether the demo's database exists.
SELECT 1 FROM pg_database WHERE datname = %(name)s;


-- name: demo_report
SELECT markdown, chart_png, figures FROM demo_reports WHERE run_id = %(run_id)s;
