-- Cyclone migration 10: named fan-in inputs (wf.node(..., inputs={"name": node, ...})).
--
-- cyclone_step_inputs.input_name holds the name a node's input binding was declared
-- with: a node whose inputs are named receives a JSON object keyed by those names
-- (each slot's upstream output under its name) instead of a list in slot order.
-- NULL for a positional binding (inputs=[...]), as for every binding written before.
-- A named binding keeps assembly_mode 'tuple' (its check, part of the base
-- schema, is unchanged); the slot still orders the bindings.
--
-- Nullable and without a default: ADD COLUMN only updates the catalog (a brief ACCESS
-- EXCLUSIVE lock on cyclone_step_inputs, no rewrite). No index: the column is read
-- with a step's bindings, found by their primary key. Workers of earlier versions
-- never name it: they would give a node with named inputs a list (the names
-- ignored), so submit workflows with named inputs once every worker runs version 10.

ALTER TABLE cyclone_step_inputs ADD COLUMN input_name text;
