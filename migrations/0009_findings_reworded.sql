-- Findings' advice is now worded for each cluster's manager (bsub, qsub, a pod's resources):
-- the findings of the jobs of clusters that are not Slurm are computed again at the next update.
UPDATE units SET findings_updated_at = NULL
WHERE cluster_id IN (SELECT id FROM clusters WHERE manager <> 'slurm');
