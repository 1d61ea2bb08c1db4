-- Which figures Prometheus gave each job (the SQLite twin of this migration says why).
ALTER TABLE units ADD COLUMN measured BIGINT NOT NULL DEFAULT 0;
UPDATE units SET measured = 31 WHERE aggregates_updated_at IS NOT NULL;
ALTER TABLE usage ADD COLUMN host_energy_units DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN emissions_units DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN gpu_energy_units DOUBLE PRECISION NOT NULL DEFAULT 0;
UPDATE usage SET host_energy_units = num_units, emissions_units = num_units,
    gpu_energy_units = num_units;
