-- Each cluster's resource manager: the schema says whose jobs the rows of a cluster are. Every
-- cluster ingested before this migration was a Slurm one.
CREATE TABLE clusters (
    id TEXT PRIMARY KEY,
    manager TEXT NOT NULL
);
INSERT INTO clusters (id, manager) SELECT DISTINCT cluster_id, 'slurm' FROM units;
