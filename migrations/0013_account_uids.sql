-- A user's and a project's id where the manager has one besides the name (Keystone's), which
-- CEEMS answers as `uid`; empty where there is none (Slurm, whose answers leave it out).
ALTER TABLE users ADD COLUMN uid TEXT NOT NULL DEFAULT '';
ALTER TABLE projects ADD COLUMN uid TEXT NOT NULL DEFAULT '';
