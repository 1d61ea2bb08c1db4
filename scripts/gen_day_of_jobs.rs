//! A day of a cluster's jobs for `scripts/bench-updater.sh`: `sacct --parsable2` lines of JOBS
//! jobs on NODES nodes that started over the 24 hours before NOW (lengths from a minute to
//! eight hours, most of them short: the median is under five minutes, the mean about 40),
//! written to DIR/sacct.txt; and on standard output their series as the exporter and the
//! recording rules give them, every 30 s over each job's life, in VictoriaMetrics's JSON import
//! format (one line per series). Jobs still running at NOW are RUNNING. Deterministic.
//!
//!     cargo run --release --example gen-day-of-jobs -- JOBS NODES NOW DIR | curl -X POST -T - VM/api/v1/import

use std::io::Write as _;

/// A small deterministic generator (xorshift64*), so that runs compare.
struct Draw(u64);

impl Draw {
    fn next(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }
}

const STEP: u64 = 30;

fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, jobs, nodes, now, dir] = args.as_slice() else {
        eprintln!("usage: gen-day-of-jobs JOBS NODES NOW DIR");
        std::process::exit(2);
    };
    let number = |s: &str| -> u64 {
        s.parse().unwrap_or_else(|_| {
            eprintln!("not a number: {s}");
            std::process::exit(2)
        })
    };
    let (jobs, nodes, now) = (number(jobs), number(nodes).max(1), number(now));
    let mut sacct = std::io::BufWriter::new(std::fs::File::create(format!("{dir}/sacct.txt"))?);
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut draw = Draw(0x9e37_79b9_7f4a_7c15);
    let mut samples = 0u64;
    for i in 0..jobs {
        let id = 1_000_000 + i;
        let user = i % 500;
        let node = i % nodes;
        let start = now - 86_400 + i * 86_400 / jobs.max(1);
        // 60 s × 480^(u²): many short jobs, a long tail up to eight hours.
        let u = draw.next();
        let length = (60.0 * 480f64.powf(u * u)) as u64;
        let end = start + length;
        let running = end > now;
        let last = end.min(now);
        let cores = 1 + (i % 8);
        let gpu = i % 10 == 0;
        let busy = 0.2 + 0.8 * draw.next();
        let watts = 20.0 * cores as f64 * (0.5 + busy);
        let memory = (1u64 << 30) * (1 + i % 16);
        let elapsed = last - start;
        let (end_text, state) = match running {
            true => ("Unknown".to_owned(), "RUNNING"),
            false => (end.to_string(), "COMPLETED"),
        };
        let gres = if gpu { ",gres/gpu=1" } else { "" };
        writeln!(
            sacct,
            "{id}|cpu|normal|proj{}|user{user}|{}|user{user}|{}|{start}|{start}|{end_text}|{:02}:{:02}:{:02}|{elapsed}|0:0|{state}|billing={cores},cpu={cores},mem={}G,node=1{gres}|node{node:04}|/home/user{user}|600|job {i}",
            user % 50,
            5000 + user,
            5000 + user,
            elapsed / 3600,
            elapsed / 60 % 60,
            elapsed % 60,
            memory >> 30,
        )?;
        let times: Vec<u64> = (start..=last).step_by(STEP as usize).collect();
        let labels = format!(r#""job":"ceems","instance":"node{node:04}:9010","uuid":"{id}""#);
        let mut series = |name: &str, value: &dyn Fn(u64) -> f64| -> std::io::Result<()> {
            write!(
                out,
                r#"{{"metric":{{"__name__":"{name}",{labels}}},"values":["#
            )?;
            for (k, t) in times.iter().enumerate() {
                let sep = if k == 0 { "" } else { "," };
                write!(out, "{sep}{}", value(*t))?;
            }
            write!(out, r#"],"timestamps":["#)?;
            for (k, t) in times.iter().enumerate() {
                let sep = if k == 0 { "" } else { "," };
                write!(out, "{sep}{}", t * 1000)?;
            }
            writeln!(out, "]}}")?;
            samples += times.len() as u64;
            Ok(())
        };
        let s = |t: u64| (t - start) as f64;
        let c = cores as f64;
        series("ceems_compute_unit_cpu_user_seconds_total", &|t| {
            0.9 * busy * c * s(t)
        })?;
        series("ceems_compute_unit_cpu_system_seconds_total", &|t| {
            0.1 * busy * c * s(t)
        })?;
        series("ceems_compute_unit_memory_used_bytes", &|t| {
            memory as f64 * (0.3 + 0.4 * ((t / STEP) % 7) as f64 / 7.0)
        })?;
        series("ceems_compute_unit_memory_fail_count", &|_| 0.0)?;
        series("ceems_compute_unit_blkio_read_bytes_total", &|t| 1e5 * s(t))?;
        series("ceems_compute_unit_blkio_write_bytes_total", &|t| {
            5e4 * s(t)
        })?;
        series("uuid:ceems_cpu_power_watts:pue", &|_| 0.6 * watts)?;
        series("uuid:ceems_host_power_watts:pue", &|_| watts)?;
        series("uuid:ceems_host_emissions_g_s:pue", &|_| {
            watts / 3.6e6 * 44.179085
        })?;
        if gpu {
            series("ceems_compute_unit_gpu_energy_joules_total", &|t| {
                250.0 * s(t)
            })?;
            series("ceems_compute_unit_gpu_utilization_ratio", &|_| busy)?;
        }
    }
    out.flush()?;
    sacct.flush()?;
    eprintln!("gen-day-of-jobs: {jobs} jobs on {nodes} nodes, {samples} samples");
    Ok(())
}
