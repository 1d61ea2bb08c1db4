-- The CPU time of each node of a multi-node job over its life, JSON `{"node": seconds}`, asked
-- of Prometheus once the job ended and its aggregates are done: a node that did nothing shows.
-- NULL: not asked yet (or a one-node job); `{}`: asked, and Prometheus had no series.
ALTER TABLE units ADD COLUMN node_cpu_seconds TEXT;
