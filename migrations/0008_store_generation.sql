-- A counter every committed write moves on PostgreSQL, where several stats-servers may share
-- the database: each compares it with the one its cached answers were made at. (A SQLite
-- database has one server, which counts its own writes.)
CREATE TABLE store_generation (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    value BIGINT NOT NULL
);
INSERT INTO store_generation (id, value) VALUES (1, 0);
