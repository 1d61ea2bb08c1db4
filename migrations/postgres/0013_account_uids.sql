-- Users' and projects' ids besides their names (the SQLite twin of this migration says why).
ALTER TABLE users ADD COLUMN uid TEXT NOT NULL DEFAULT '';
ALTER TABLE projects ADD COLUMN uid TEXT NOT NULL DEFAULT '';
