//! `--runtime.gomaxprocs`, CEEMS's flag (and its `GOMAXPROCS` variable) for how many threads
//! run a program's work: here, the worker threads of its async runtime.

use super::{ConfigError, Kind, Layered, Opt};

/// The option, with this program's default (`0`: a thread per core available).
pub fn opts(default: &str) -> Vec<Opt> {
    vec![Opt::new(
        "runtime.gomaxprocs",
        Kind::Int,
        "Worker threads (CEEMS's GOMAXPROCS); 0: one per core available to the process, its CPU affinity and cgroup CPU quota counted",
    )
    .default(default)
    .env("GOMAXPROCS")]
}

/// The worker threads `--runtime.gomaxprocs` asks for.
pub fn worker_threads(settings: &Layered) -> Result<usize, ConfigError> {
    let asked: i64 = settings.get("runtime.gomaxprocs")?;
    match asked {
        0 => Ok(available_cores()),
        n if (1..=4096).contains(&n) => Ok(n as usize),
        n => Err(ConfigError::Invalid {
            origin: settings.origin_of("runtime.gomaxprocs"),
            key: "runtime.gomaxprocs".into(),
            message: format!("{n} worker threads: give 0 (one per available core) to 4096"),
        }),
    }
}

/// The cores this process may use: the standard library reads the CPU affinity mask and the
/// cgroup (v1 and v2) CPU quota, so a server confined to 2 cores of 64 gets 2 threads.
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_is_one_thread_per_available_core_and_a_bad_count_is_refused_by_name() {
        let opts = opts("0");
        let load = |args: &[&str]| {
            let cmd = super::super::build_command(clap::Command::new("lb"), &opts);
            let m = cmd.try_get_matches_from(args).unwrap();
            let settings = super::super::load("lb", &opts, &m).unwrap();
            worker_threads(&settings)
        };
        assert_eq!(load(&["lb"]).unwrap(), available_cores());
        assert_eq!(load(&["lb", "--runtime.gomaxprocs=3"]).unwrap(), 3);
        let e = load(&["lb", "--runtime.gomaxprocs=-1"])
            .unwrap_err()
            .to_string();
        assert!(e.contains("runtime.gomaxprocs") && e.contains("-1"), "{e}");
    }
}
