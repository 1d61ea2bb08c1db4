//! Which GPUs a Slurm job holds, and what share of each: Slurm's GPU indices from a prolog's
//! GPU→job files or the job processes' environment (`SLURM_JOB_GPUS`, else
//! `SLURM_STEP_GPUS`), translated through `--collector.slurm.gpu-order-map`, with shards and
//! MPS as fractions.

use std::collections::HashMap;
use std::path::Path;

use crate::host::gpu::GpuDevice;
use crate::host::procfs;

/// `--collector.slurm.gpu-order-map`: Slurm's GPU index → the device's minor number and, for a
/// MIG instance, its GPU instance id.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OrderMap(HashMap<u32, (u32, Option<u32>)>);

impl OrderMap {
    /// `<slurm index>:<minor>[.<gpu instance id>]`, comma-separated.
    pub fn parse(text: &str) -> Result<OrderMap, String> {
        let mut map = HashMap::new();
        for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || {
                format!(
                    "`{entry}` in the GPU order map is not <slurm index>:<minor>[.<gpu instance id>]"
                )
            };
            let (slurm, device) = entry.split_once(':').ok_or_else(bad)?;
            let slurm: u32 = slurm.trim().parse().map_err(|_| bad())?;
            let (minor, gi) = match device.trim().split_once('.') {
                Some((m, g)) => (m, Some(g.parse::<u32>().map_err(|_| bad())?)),
                None => (device.trim(), None),
            };
            let minor: u32 = minor.parse().map_err(|_| bad())?;
            if map.insert(slurm, (minor, gi)).is_some() {
                return Err(format!(
                    "Slurm GPU index {slurm} appears twice in the GPU order map"
                ));
            }
        }
        Ok(OrderMap(map))
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The device Slurm calls `slurm_index`.
    pub fn device<'a>(&self, devices: &'a [GpuDevice], slurm_index: u32) -> Option<&'a GpuDevice> {
        match self.0.get(&slurm_index) {
            Some((minor, gi)) => devices
                .iter()
                .find(|d| d.minor == *minor && d.gpu_instance_id == *gi),
            None if self.0.is_empty() => usize::try_from(slurm_index)
                .ok()
                .and_then(|i| devices.get(i)),
            None => None,
        }
    }
}

/// Shard and MPS counts of a node's `gres.conf` (`Name=shard Count=…`, `Name=mps Count=…`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GresShares {
    pub shards: u32,
    pub mps: u32,
}

/// The shard and MPS counts of `gres.conf` lines for this node (lines of other nodes skipped;
/// a host range is taken to include it).
pub fn parse_gres_conf(text: &str, hostname: &str) -> Result<GresShares, String> {
    let mut shares = GresShares::default();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let mut name = None;
        let mut count = None;
        let mut other_node = false;
        for word in line.split_whitespace() {
            let Some((k, v)) = word.split_once('=') else {
                return Err(format!(
                    "gres.conf line {}: `{word}` is not key=value",
                    n + 1
                ));
            };
            match k.to_ascii_lowercase().as_str() {
                "name" => name = Some(v.to_ascii_lowercase()),
                "count" => {
                    count = Some(parse_count(v).ok_or_else(|| {
                        format!("gres.conf line {}: count `{v}` is not a number", n + 1)
                    })?)
                }
                "nodename" => other_node = !v.contains('[') && v != hostname,
                _ => {}
            }
        }
        if other_node {
            continue;
        }
        match (name.as_deref(), count) {
            (Some("shard"), Some(c)) => shares.shards = shares.shards.saturating_add(c),
            (Some("mps"), Some(c)) => shares.mps = shares.mps.saturating_add(c),
            _ => {}
        }
    }
    Ok(shares)
}

/// Slurm counts accept K/M/G suffixes.
fn parse_count(v: &str) -> Option<u32> {
    let (digits, scale) = match v.chars().last()? {
        'k' | 'K' => (&v[..v.len() - 1], 1024),
        'm' | 'M' => (&v[..v.len() - 1], 1024 * 1024),
        'g' | 'G' => (&v[..v.len() - 1], 1024 * 1024 * 1024),
        _ => (v, 1),
    };
    digits.parse::<u32>().ok()?.checked_mul(scale)
}

/// What a job process's environment says of its GPUs.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct JobGpuEnv {
    /// Slurm's GPU indices.
    pub gpus: Vec<u32>,
    pub shards_on_node: Option<u32>,
    pub mps_percentage: Option<f64>,
    /// From `SLURM_JOB_GPUS` (the job's), not `SLURM_STEP_GPUS` (one step's).
    pub from_job: bool,
}

/// `SLURM_JOB_GPUS`, falling back to `SLURM_STEP_GPUS`; None when neither names a GPU.
pub fn from_environ(environ: &[u8]) -> Option<JobGpuEnv> {
    let var = |name: &str| {
        procfs::environ_var(environ, name).map(|v| String::from_utf8_lossy(v).into_owned())
    };
    let indices =
        |s: String| -> Vec<u32> { s.split(',').filter_map(|i| i.trim().parse().ok()).collect() };
    let job = var("SLURM_JOB_GPUS").map(indices).filter(|g| !g.is_empty());
    let from_job = job.is_some();
    let gpus = job.or_else(|| {
        var("SLURM_STEP_GPUS")
            .map(indices)
            .filter(|g| !g.is_empty())
    })?;
    Some(JobGpuEnv {
        gpus,
        from_job,
        shards_on_node: var("SLURM_SHARDS_ON_NODE").and_then(|s| s.trim().parse().ok()),
        mps_percentage: var("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
            .and_then(|s| s.trim().parse::<f64>().ok())
            .filter(|p| *p > 0.0 && *p <= 100.0),
    })
}

/// The job's share of each GPU it holds: 1 for a whole GPU; with shards, its shards over the
/// shards of one GPU; with MPS, its thread percentage.
pub fn share(env: &JobGpuEnv, gres: GresShares, gpus_on_node: usize) -> f64 {
    if let (Some(mine), true) = (env.shards_on_node, gres.shards > 0 && gpus_on_node > 0) {
        let per_gpu = f64::from(gres.shards) / gpus_on_node as f64;
        // Slurm spreads a job's shards over its GPUs.
        let per_job_gpu = f64::from(mine) / env.gpus.len().max(1) as f64;
        return (per_job_gpu / per_gpu).clamp(0.0, 1.0);
    }
    if let Some(p) = env.mps_percentage {
        return p / 100.0;
    }
    1.0
}

/// A prolog's GPU→job files: one file per Slurm GPU index, holding the job id.
pub fn read_job_map(dir: &Path) -> HashMap<String, Vec<u32>> {
    let mut jobs: HashMap<String, Vec<u32>> = HashMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return jobs;
    };
    for e in entries.flatten() {
        let Some(index) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        let job = text.trim();
        if !job.is_empty() && job.bytes().all(|b| b.is_ascii_digit()) {
            jobs.entry(job.to_owned()).or_default().push(index);
        }
    }
    for gpus in jobs.values_mut() {
        gpus.sort_unstable();
    }
    jobs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(index: usize, minor: u32, gi: Option<u32>) -> GpuDevice {
        GpuDevice::for_test(index, minor, gi, 1.0)
    }

    #[test]
    fn order_maps_and_their_errors() {
        let m = OrderMap::parse("0:0,1:1,2:4,4:2.1, 5:2.5").unwrap();
        let devices = [
            device(0, 0, None),
            device(1, 1, None),
            device(2, 2, Some(1)),
            device(3, 2, Some(5)),
            device(4, 4, None),
        ];
        assert_eq!(m.device(&devices, 2).map(|d| d.minor), Some(4));
        assert_eq!(m.device(&devices, 4).map(|d| d.index), Some(2));
        assert_eq!(m.device(&devices, 5).map(|d| d.index), Some(3));
        assert_eq!(m.device(&devices, 3), None, "index not in the map");
        // Without a map, Slurm's index is the device's position.
        let none = OrderMap::parse("").unwrap();
        assert_eq!(
            none.device(&devices, 3).map(|d| d.gpu_instance_id),
            Some(Some(5))
        );
        assert_eq!(none.device(&devices, 9), None);
        for (bad, says) in [
            ("0:0,1", "`1`"),
            ("a:0", "`a:0`"),
            ("0:x", "`0:x`"),
            ("0:1.y", "`0:1.y`"),
            ("0:1,0:2", "appears twice"),
        ] {
            let e = OrderMap::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn gres_conf_shards_and_mps() {
        let text =
            "# GPUs\nName=gpu File=/dev/nvidia[0-3]\nName=shard Count=16 File=/dev/nvidia[0-3]\n\
                    NodeName=other Name=shard Count=99\nNodeName=n1 Name=mps Count=2K\n";
        assert_eq!(
            parse_gres_conf(text, "n1").unwrap(),
            GresShares {
                shards: 16,
                mps: 2048
            }
        );
        assert!(parse_gres_conf("Name=shard Count=many", "n1")
            .unwrap_err()
            .contains("line 1"));
        assert!(parse_gres_conf("Name shard", "n1").is_err());
    }

    #[test]
    fn environ_prefers_the_job_gpus_and_reads_shares() {
        let env = b"SLURM_JOB_ID=1\0SLURM_JOB_GPUS=2,3\0SLURM_STEP_GPUS=1,4\0";
        assert_eq!(from_environ(env).unwrap().gpus, [2, 3]);
        assert!(from_environ(env).unwrap().from_job);
        let step = b"SLURM_STEP_GPUS=1\0SLURM_JOB_ID=1\0";
        assert_eq!(from_environ(step).unwrap().gpus, [1]);
        assert!(!from_environ(step).unwrap().from_job);
        let empty = b"SLURM_JOB_GPUS=\0SLURM_STEP_GPUS=0\0";
        assert_eq!(from_environ(empty).unwrap().gpus, [0]);
        assert_eq!(from_environ(b"SLURM_JOB_ID=1\0"), None);
        assert_eq!(from_environ(b"SLURM_JOB_GPUS=none\0"), None);

        let shards = from_environ(b"SLURM_JOB_GPUS=0\0SLURM_SHARDS_ON_NODE=2\0").unwrap();
        let gres = GresShares { shards: 16, mps: 0 };
        // 16 shards over 4 GPUs: 2 of one GPU's 4 shards.
        assert_eq!(share(&shards, gres, 4), 0.5);
        let mps =
            from_environ(b"SLURM_JOB_GPUS=0\0CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25\0").unwrap();
        assert_eq!(share(&mps, GresShares::default(), 4), 0.25);
        let whole = from_environ(b"SLURM_JOB_GPUS=0,1\0").unwrap();
        assert_eq!(share(&whole, gres, 4), 1.0);
    }

    #[test]
    fn ceems_prolog_job_map() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/compat/fixtures/gpujobmap");
        let map = read_job_map(&dir);
        assert_eq!(map["1009248"], [2, 3]);
        assert_eq!(map["1009249"], [0]);
        assert_eq!(map["1009250"], [1]);
        assert!(read_job_map(Path::new("/nonexistent")).is_empty());
    }
}
