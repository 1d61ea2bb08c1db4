//! Writes a generated Slurm job tree for benchmarks: `gen-job-tree DIR JOBS v1|v2`.

use ceems::host::cgroup::CgroupVersion;
use ceems::testing::{generate, TreeSpec};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let (Some(dir), Some(jobs), Some(version)) = (args.get(1), args.get(2), args.get(3)) else {
        anyhow::bail!("usage: gen-job-tree DIR JOBS v1|v2");
    };
    let version = CgroupVersion::from_flag(version)
        .ok_or_else(|| anyhow::anyhow!("version must be v1 or v2, not {version}"))?;
    let tree = generate(
        std::path::Path::new(dir),
        TreeSpec::new(version, jobs.parse()?),
    )?;
    println!("{}", tree.root.display());
    Ok(())
}
