#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/ceems.sh): removes what prolog.sh wrote
# for the job that ended. A GPU entry is removed only if it still names this job.
set -eu
PROPS_DIR=${CEEMS_JOB_PROPS_DIR:-/run/ceems/slurmjobprops}
GPU_MAP_DIR=${CEEMS_GPU_MAP_DIR:-/run/ceems/gpujobmap}

[ -n "${SLURM_JOB_ID:-}" ] || exit 0
rm -f "$PROPS_DIR/$SLURM_JOB_ID"
if [ -d "$GPU_MAP_DIR" ]; then
    for f in "$GPU_MAP_DIR"/*; do
        [ -f "$f" ] || continue
        if [ "$(cat "$f" 2>/dev/null)" = "$SLURM_JOB_ID" ]; then
            rm -f "$f"
        fi
    done
fi
exit 0
