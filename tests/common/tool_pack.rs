//! What CEEMS's `tool-*` scenarios run beside the exporters: stand-ins of the GPU exporters its
//! `mock_exporters test-mode` serves (series names, labels and the constant powers of its test
//! mode), and a Prometheus with the pack's `prometheus.yml`.

use std::path::Path;
use std::process::{Command, Stdio};

/// NVIDIA's DCGM exporter (five devices, two of them MIG instances of one GPU, 200 W each),
/// AMD's SMI exporter (four devices, 100 W each, in microwatts) or AMD's device metrics
/// exporter (four devices).
/// Which generation of CEEMS's e2e material a scenario runs: its Prometheus config and its
/// mock GPU exporters' series names.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pack {
    /// v0.10.2 (`ceems-api`).
    V010,
    /// v0.16 (`ceems-v0.16`): AMD's device metrics exporter names its series `amd_gpu_*`.
    V016,
}

impl Pack {
    fn dir(self) -> &'static str {
        match self {
            Pack::V010 => "ceems-api",
            Pack::V016 => "ceems-v0.16",
        }
    }
}

pub fn gpu_exporter(kind: &'static str, pack: Pack) -> super::http::TestServer {
    use super::http::{Request, Response};
    let mut body = String::new();
    match kind {
        "dcgm" => {
            let devices = [
                ("0", "GPU-956348bc-d43d-23ed-53d4-857749fa2b67", "0", "15"),
                ("1", "GPU-956348bc-d43d-23ed-53d4-857749fa2b67", "1", "15"),
                ("2", "GPU-feba7e40-d724-01ff-b00f-3a439a28a6c7", "", "16"),
                ("3", "GPU-61a65011-6571-a6d2-5th8-66cbb6f7f9c3", "", "17"),
                ("4", "GPU-1d4d0f3e-b51a-4040-96e3-bf380f7c5728", "", "18"),
            ];
            for (id, uuid, iid, bus) in devices {
                for (name, value) in [
                    ("DCGM_FI_DEV_GPU_UTIL", 50.0),
                    ("DCGM_FI_DEV_FB_USED", 40.0),
                    ("DCGM_FI_DEV_FB_FREE", 60.0),
                    ("DCGM_FI_DEV_POWER_USAGE", 200.0),
                    ("DCGM_FI_DEV_POWER_USAGE_INSTANT", 200.0),
                    ("DCGM_FI_PROF_SM_ACTIVE", 0.5),
                    ("DCGM_FI_PROF_SM_OCCUPANCY", 0.5),
                    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.5),
                ] {
                    body.push_str(&format!(
                        "{name}{{Hostname=\"host\",UUID=\"{uuid}\",GPU_I_ID=\"{iid}\",device=\"nvidia{id}\",gpu=\"{id}\",pci_bus_id=\"00000000:{bus}:00.0\",modelName=\"NVIDIA A100 80GiB\"}} {value}\n"
                    ));
                }
            }
        }
        "amd-smi" => {
            for i in 0..4 {
                for (name, label, value) in [
                    ("amd_gpu_power", "gpu_power", 100_000_000.0),
                    ("amd_gpu_use_percent", "gpu_use_percent", 50.0),
                    ("amd_gpu_memory_use_percent", "gpu_memory_use_percent", 50.0),
                ] {
                    body.push_str(&format!(
                        "{name}{{{label}=\"{i}\",productname=\"Advanced Micro Devices Inc\"}} {value}\n"
                    ));
                }
            }
        }
        _ if pack == Pack::V016 => {
            for i in 0..4 {
                for (name, value) in [
                    ("amd_gpu_gfx_activity", 50.0),
                    ("amd_gpu_total_vram", 25_769_803_776.0),
                    ("amd_gpu_used_vram", 12_884_901_888.0),
                    ("amd_gpu_package_power", 100.0),
                ] {
                    body.push_str(&format!(
                        "{name}{{gpu_id=\"{i}\",gpu_partition_id=\"0\",serial_number=\"2017000080{i}c\"}} {value}\n"
                    ));
                }
            }
        }
        _ => {
            for i in 0..4 {
                for (name, value) in [
                    ("gpu_gfx_activity", 50.0),
                    ("gpu_total_vram", 25_769_803_776.0),
                    ("gpu_used_vram", 12_884_901_888.0),
                    ("gpu_power_usage", 100_000_000.0),
                ] {
                    body.push_str(&format!(
                        "{name}{{gpu_id=\"{i}\",gpu_partition_id=\"0\",serial_number=\"2017000080{i}c\"}} {value}\n"
                    ));
                }
            }
        }
    }
    super::http::TestServer::start(
        false,
        std::sync::Arc::new(move |_: &Request| Response::raw(200, body.clone())),
    )
}

/// Prometheus with the pack's config, its GPU exporters' stand-ins and `extra` targets (the
/// pack's address, ours), once `ready` (a PromQL query) answers `count` series; killed when
/// dropped.
pub fn pack_prometheus(
    pack: Pack,
    dir: &Path,
    extra: &[(&str, String)],
    ready: &str,
    count: usize,
) -> (super::KillOnDrop, String, Vec<super::http::TestServer>) {
    pack_prometheus_with(pack, "prometheus.yml", dir, extra, ready, count)
}

/// As [`pack_prometheus`], with another of the pack's Prometheus configs.
pub fn pack_prometheus_with(
    pack: Pack,
    config_name: &str,
    dir: &Path,
    extra: &[(&str, String)],
    ready: &str,
    count: usize,
) -> (super::KillOnDrop, String, Vec<super::http::TestServer>) {
    let exporters = vec![
        ("localhost:9400", gpu_exporter("dcgm", pack)),
        ("localhost:9500", gpu_exporter("amd-smi", pack)),
        ("localhost:9600", gpu_exporter("amd-device-metrics", pack)),
    ];
    let mut config = std::fs::read_to_string(
        super::fixtures()
            .join(pack.dir())
            .join("cmd/ceems_tool/testdata")
            .join(config_name),
    )
    .unwrap();
    let ours = exporters
        .iter()
        .map(|(p, s)| (*p, s.url()))
        .chain(extra.iter().cloned());
    for (pack, url) in ours {
        config = config.replace(pack, url.trim_start_matches("http://"));
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let port = super::free_port();
    let child = super::KillOnDrop(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let url = format!("http://127.0.0.1:{port}");
    let start = std::time::Instant::now();
    loop {
        let answer = ureq::get(&format!("{url}/api/v1/query"))
            .query("query", ready)
            .call()
            .ok()
            .and_then(|r| r.into_string().ok())
            .unwrap_or_default();
        if answer.matches("\"metric\"").count() == count {
            break;
        }
        assert!(
            start.elapsed() < std::time::Duration::from_secs(60),
            "{answer}"
        );
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
    (child, url, exporters.into_iter().map(|(_, s)| s).collect())
}

/// `ceems_tool ARGS` from `dir` with `input` on standard input: exit status and standard error.
pub fn ceems_tool(dir: &Path, args: &[&str], input: &str) -> (i32, String) {
    use std::io::Write as _;
    let link = dir.join("ceems_tool");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ceems"), &link).unwrap();
    }
    let mut child = Command::new(&link)
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
