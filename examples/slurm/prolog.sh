#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/ceems.sh), run as root on the compute
# node before a job starts. It writes what the exporter would otherwise read from the job's
# processes, so the exporter needs no capability for it:
#   $PROPS_DIR/<job id>        "user account nodelist workdir" (CEEMS's job properties format)
#   $GPU_MAP_DIR/<gpu index>   the id of the job that holds that GPU
# The exporter reads the first with
#   --collector.slurm.info-metrics --collector.slurm.job-props-path=/run/ceems/slurmjobprops
# and the second (CEEMS's GPU map format, for sites whose exporter must not read job
# environments to map GPUs) with --collector.slurm.gpu-job-map-path=/run/ceems/gpujobmap
set -eu
PROPS_DIR=${CEEMS_JOB_PROPS_DIR:-/run/ceems/slurmjobprops}
GPU_MAP_DIR=${CEEMS_GPU_MAP_DIR:-/run/ceems/gpujobmap}

[ -n "${SLURM_JOB_ID:-}" ] || exit 0
mkdir -p "$PROPS_DIR" "$GPU_MAP_DIR"
chmod 0755 "$PROPS_DIR" "$GPU_MAP_DIR"

# Written to a temporary name and renamed, so the exporter never reads half a file.
tmp="$PROPS_DIR/.$SLURM_JOB_ID.$$"
printf '%s %s %s %s' "${SLURM_JOB_USER:-}" "${SLURM_JOB_ACCOUNT:-}" \
    "${SLURM_JOB_NODELIST:-}" "${SLURM_JOB_WORK_DIR:-${SLURM_SUBMIT_DIR:-}}" > "$tmp"
chmod 0644 "$tmp"
mv -f "$tmp" "$PROPS_DIR/$SLURM_JOB_ID"

# SLURM_JOB_GPUS is the prolog's list of GPU indexes, e.g. "0,2".
gpus=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
if [ -n "$gpus" ]; then
    for idx in $(printf '%s' "$gpus" | tr ',' ' '); do
        case "$idx" in
            *[!0-9]*) continue ;;
        esac
        tmp="$GPU_MAP_DIR/.$idx.$$"
        printf '%s' "$SLURM_JOB_ID" > "$tmp"
        chmod 0644 "$tmp"
        mv -f "$tmp" "$GPU_MAP_DIR/$idx"
    done
fi
exit 0
