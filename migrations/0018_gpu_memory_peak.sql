-- The highest GPU memory a job used on any of its GPUs (bytes), from the exporter's
-- `ceems_compute_unit_gpu_memory_used_bytes`: a job that fits a MIG slice shows (`mig_fit`).
ALTER TABLE units ADD COLUMN gpu_memory_peak_bytes REAL;
