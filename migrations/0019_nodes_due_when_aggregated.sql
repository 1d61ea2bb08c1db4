-- A multi-node job is due for its per-node figures once its aggregates are done: the index
-- holds those only, not every multi-node job still waiting for Prometheus (or never to get its
-- figures: a cluster without one), which made it some 20 bytes a job at such a cluster.
DROP INDEX IF EXISTS units_nodes_due;
CREATE INDEX units_nodes_due ON units (cluster_id, id)
    WHERE node_cpu_seconds IS NULL AND nodes LIKE '%,%' AND aggregates_status = 'done';
