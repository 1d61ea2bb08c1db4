-- What the stats-server's policies decided about running jobs (warnings, cancellations).
-- A row is written, and so claimed, before its mail or its cancel goes out, and marked done
-- after: the unique key makes each stage of each policy happen once per job (a job is its
-- cluster, id and start time, so an id Slurm gives again is another job), across restarts,
-- kills and servers sharing the database. A dry run's rows are its own.
CREATE TABLE policy_actions (
    id INTEGER PRIMARY KEY,
    cluster_id TEXT NOT NULL,
    uuid TEXT NOT NULL,
    started_at INTEGER NOT NULL,
    usr TEXT NOT NULL,
    policy TEXT NOT NULL,
    -- 1 for the first stage of the policy, and so on; action is `warn` or `cancel`.
    stage INTEGER NOT NULL,
    action TEXT NOT NULL,
    dry_run INTEGER NOT NULL DEFAULT 0,
    decided_at INTEGER NOT NULL,
    -- The figures that led to the decision (JSON): use, window, GPU-hours, energy, CO2.
    figures TEXT NOT NULL DEFAULT '{}',
    -- pending (claimed, not done), mailed, cancelled, gone (ended before the cancel),
    -- refused (the manager's answer did not match the job), failed (retries spent), dry-run,
    -- uncertain (a server died while acting; not repeated).
    outcome TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    detail TEXT NOT NULL DEFAULT '',
    done_at INTEGER,
    -- The messages queued for it (the user's, the admins' copy).
    message_ids TEXT NOT NULL DEFAULT '',
    UNIQUE (cluster_id, uuid, started_at, policy, stage, dry_run)
);
CREATE INDEX policy_actions_pending ON policy_actions (id) WHERE outcome = 'pending';
CREATE INDEX policy_actions_by_unit ON policy_actions (cluster_id, uuid, started_at);
