-- Which figures Prometheus gave each job at least once, as bits: 1 CPU time, 2 node energy,
-- 4 emissions, 8 CPU package energy, 16 GPU energy. A job whose nodes have no power source
-- then shows no energy ("no power data") instead of 0 kWh. Jobs aggregated before this
-- version keep the answers they had: each of their figures counts as measured.
ALTER TABLE units ADD COLUMN measured INTEGER NOT NULL DEFAULT 0;
UPDATE units SET measured = 31 WHERE aggregates_updated_at IS NOT NULL;
-- How many jobs of a usage group have each energy figure: none, and the group has none.
ALTER TABLE usage ADD COLUMN host_energy_units REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN emissions_units REAL NOT NULL DEFAULT 0;
ALTER TABLE usage ADD COLUMN gpu_energy_units REAL NOT NULL DEFAULT 0;
UPDATE usage SET host_energy_units = num_units, emissions_units = num_units,
    gpu_energy_units = num_units;
