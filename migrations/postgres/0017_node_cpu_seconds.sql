-- The CPU time of each node of a multi-node job over its life, JSON `{"node": seconds}`, asked
-- of Prometheus once the job ended and its aggregates are done: a node that did nothing shows.
-- NULL: not asked yet (or a one-node job); `{}`: asked, and Prometheus had no series.
ALTER TABLE units ADD COLUMN node_cpu_seconds TEXT;
-- The jobs still due, found without reading the others: a million one-node jobs keep NULL
-- forever, and scanning them took 360 ms of every update.
CREATE INDEX units_nodes_due ON units (cluster_id, id)
    WHERE node_cpu_seconds IS NULL AND nodes LIKE '%,%';
