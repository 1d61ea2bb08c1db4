//! Real libvirt and KVM: start libvirtd (no systemd here, so libvirt uses its own `machine/`
//! cgroup layout), define a diskless domain carrying Nova's metadata, boot it (it idles in its
//! firmware) and scrape the `libvirt` collector: the VM is a unit with its instance UUID, CPU
//! seconds that grow and the memory its cgroup files hold; with perf and eBPF on, QEMU's
//! context switches and its firmware reads are counted for the VM. Then the VM as an
//! OpenStack cloud's server: Nova and Keystone stand-ins name it alice's, and the stats-server
//! (its series from a real Prometheus scraping the exporter) gives alice its usage and its
//! report, `ceems lb` relays her queries of it and refuses bob's.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ensure_tools, label_of, name_of, parse_series, runnable, start_exporter, KillOnDrop};

const CONNECT: &str = "qemu:///system";

fn virsh(args: &[&str]) -> Result<String, String> {
    let out = Command::new("virsh")
        .arg("-c")
        .arg(CONNECT)
        .args(args)
        .output()
        .map_err(|e| format!("virsh: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}

fn program(name: &str) -> Option<PathBuf> {
    ceems::host::command::find_program(name, std::env::var_os("PATH").as_deref())
}

fn tools_present() -> bool {
    ["libvirtd", "virtlogd", "virsh", "qemu-system-x86_64"]
        .iter()
        .all(|t| program(t).is_some())
}

/// The daemons this test started, stopped when it ends.
type Daemons = Vec<KillOnDrop>;

/// Starts virtlogd and libvirtd unless a libvirtd already answers.
fn libvirt_up() -> Result<Daemons, String> {
    if virsh(&["version"]).is_ok() {
        return Ok(Vec::new());
    }
    for dir in [
        "/var/log/libvirt",
        "/run/libvirt",
        "/var/lib/libvirt/qemu",
        "/var/cache/libvirt/qemu",
    ] {
        std::fs::create_dir_all(dir).map_err(|e| format!("{dir}: {e}"))?;
    }
    let mut started = Vec::new();
    for daemon in ["virtlogd", "libvirtd"] {
        let path = program(daemon).ok_or_else(|| format!("no {daemon}"))?;
        let child = Command::new(path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{daemon}: {e}"))?;
        started.push(KillOnDrop(child));
    }
    let start = Instant::now();
    while let Err(e) = virsh(&["version"]) {
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!("libvirtd did not answer in 20 s: {e}"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(started)
}

/// The domain, destroyed and undefined when dropped.
struct Vm {
    name: String,
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = virsh(&["destroy", &self.name]);
        let _ = virsh(&["undefine", &self.name]);
    }
}

fn domain_xml(name: &str, uuid: &str) -> String {
    format!(
        r#"<domain type='kvm'>
  <name>{name}</name>
  <uuid>{uuid}</uuid>
  <metadata>
    <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
      <nova:package version="27.0.0"/>
      <nova:name>ceems-lab</nova:name>
      <nova:creationTime>2026-11-23 12:00:00</nova:creationTime>
      <nova:flavor name="m1.nano">
        <nova:memory>64</nova:memory>
        <nova:disk>0</nova:disk>
        <nova:swap>0</nova:swap>
        <nova:ephemeral>0</nova:ephemeral>
        <nova:vcpus>1</nova:vcpus>
      </nova:flavor>
      <nova:owner>
        <nova:user uuid="0b9e7a8c4f1d4e2a9c3b5d6e7f8a9b0c">alice</nova:user>
        <nova:project uuid="5a4b3c2d1e0f49a8b7c6d5e4f3a2b1c0">physics</nova:project>
      </nova:owner>
    </nova:instance>
  </metadata>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type><boot dev='network'/></os>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <serial type='pty'/>
    <memballoon model='none'/>
  </devices>
</domain>
"#
    )
}

/// The VM's directory in the hierarchy that accounts its memory (v1 memory, or v2).
fn memory_dir(name: &str) -> Option<PathBuf> {
    ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"]
        .iter()
        .flat_map(|root| {
            ["machine", "machine.slice"]
                .iter()
                .map(move |p| Path::new(root).join(p))
        })
        .filter_map(|parent| std::fs::read_dir(parent).ok())
        .flat_map(|d| d.flatten())
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains(name))
}

fn read_u64(path: &Path) -> u64 {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .trim()
        .parse()
        .unwrap_or(0)
}

#[test]
fn a_booted_vm_is_a_unit_with_its_instance_uuid() {
    let test = "a_booted_vm_is_a_unit_with_its_instance_uuid";
    if !Path::new("/dev/kvm").exists() {
        println!("SKIPPED {test}: no /dev/kvm on this machine");
        return;
    }
    let tools = ensure_tools(
        tools_present,
        &[
            "libvirt-daemon-system",
            "libvirt-clients",
            "qemu-system-x86",
        ],
        &[],
    );
    if !runnable(test, tools) {
        return;
    }
    // Without udev, /dev/kvm stays root's alone; QEMU runs as libvirt-qemu in group kvm.
    let _ = Command::new("chgrp").args(["kvm", "/dev/kvm"]).status();
    let _ = Command::new("chmod").args(["0660", "/dev/kvm"]).status();
    let _daemons = libvirt_up().unwrap_or_else(|e| panic!("{test}: {e}"));

    let id = std::process::id();
    let name = format!("instance-{:08x}", 0x00c0_0000 + (id & 0xffff));
    let uuid = format!("8d3f5c2e-1b7a-4c39-9e42-{:012x}", u64::from(id));
    let xml = std::env::temp_dir().join(format!("{name}.xml"));
    std::fs::write(&xml, domain_xml(&name, &uuid)).unwrap();
    let _ = virsh(&["destroy", &name]);
    let _ = virsh(&["undefine", &name]);
    virsh(&["define", &xml.to_string_lossy()]).unwrap_or_else(|e| panic!("define: {e}"));
    let vm = Vm { name: name.clone() };

    let exporter = start_exporter(
        Path::new("/"),
        &[
            "--collector.disable-defaults",
            "--collector.libvirt",
            "--collector.perf.software-events",
            "--collector.ebpf.io-metrics",
            "--collector.ebpf.network-metrics",
            "--web.disable-exporter-metrics",
        ],
    );
    // Started after the exporter, so that eBPF sees QEMU read its firmware.
    virsh(&["start", &vm.name]).unwrap_or_else(|e| panic!("start: {e}"));
    let cgroup = memory_dir(&name).unwrap_or_else(|| panic!("no cgroup of {name}"));
    println!("{name} runs in {}", cgroup.display());
    let vm_series = |text: &str, family: &str| -> Option<f64> {
        parse_series(text)
            .into_iter()
            .find(|(k, _)| name_of(k) == family && label_of(k, "uuid") == Some(uuid.as_str()))
            .map(|(k, v)| {
                assert_eq!(label_of(&k, "manager"), Some("libvirt"), "{k}");
                v
            })
    };
    let cpu = |text: &str| {
        vm_series(text, "ceems_compute_unit_cpu_user_seconds_total").unwrap_or(0.0)
            + vm_series(text, "ceems_compute_unit_cpu_system_seconds_total").unwrap_or(0.0)
    };
    let first = exporter.get("/metrics");
    assert!(
        vm_series(&first, "ceems_compute_unit_memory_used_bytes").is_some(),
        "the VM {uuid} is not a unit:\n{first}"
    );
    let start = Instant::now();
    let (before, mut after) = (cpu(&first), 0.0);
    while start.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(500));
        after = cpu(&exporter.get("/metrics"));
        if after > before && before > 0.0 {
            break;
        }
    }
    assert!(
        after > before && before > 0.0,
        "CPU seconds of the VM did not grow: {before} then {after}"
    );

    // perf counts QEMU's threads (its vCPUs among them), opened at the first scrape.
    let switches = |text: &str| vm_series(text, "ceems_perf_context_switches_total");
    let text = exporter.get("/metrics");
    let first_switches = switches(&text);
    std::thread::sleep(Duration::from_secs(2));
    let last_switches = switches(&exporter.get("/metrics"));
    assert!(
        first_switches.is_some_and(|a| last_switches.is_some_and(|b| b > a)),
        "the VM's context switches were not counted: {first_switches:?} then {last_switches:?}"
    );
    assert!(
        text.contains("ceems_scrape_collector_success{collector=\"libvirt\"} 1"),
        "the libvirt collector failed with perf and eBPF on:\n{text}"
    );
    // eBPF saw QEMU, in the VM's cgroup, read its firmware (SeaBIOS alone is 256 KiB).
    let read: f64 = parse_series(&text)
        .into_iter()
        .filter(|(k, _)| {
            name_of(k) == "ceems_ebpf_read_bytes_total"
                && label_of(k, "uuid") == Some(uuid.as_str())
        })
        .map(|(_, v)| v)
        .sum();
    assert!(read >= 256.0 * 1024.0, "the VM read {read} bytes:\n{text}");

    // Memory against the VM's own cgroup file, read right after the scrape.
    let text = exporter.get("/metrics");
    let scraped = vm_series(&text, "ceems_compute_unit_memory_used_bytes").unwrap();
    let file = ["memory.usage_in_bytes", "memory.current"]
        .iter()
        .map(|f| cgroup.join(f))
        .find(|p| p.exists())
        .expect("a memory file");
    let kernel = read_u64(&file) as f64;
    assert!(
        kernel > 0.0 && (scraped - kernel).abs() <= kernel * 0.05,
        "memory used: exporter {scraped}, {} {kernel}",
        file.display()
    );
    println!(
        "{name} ({uuid}): cpu {before:.3} s then {after:.3} s; memory exporter {scraped} / kernel {kernel}; context switches {first_switches:?} then {last_switches:?}; read {read} bytes"
    );
    a_transient_vm_is_found_in_the_runtime_directory(&exporter, id);
    the_vm_as_a_clouds_server(exporter.port, &uuid);
}

/// A transient domain (`virsh create`, no `define`) has its XML only in libvirt's runtime
/// directory, `/run/libvirt/qemu`, where the exporter looks first.
fn a_transient_vm_is_found_in_the_runtime_directory(exporter: &common::Running, id: u32) {
    let name = format!("instance-{:08x}", 0x00d0_0000 + (id & 0xffff));
    let uuid = format!("5e0c7a41-2f6b-4d8e-a1c3-{:012x}", u64::from(id));
    let xml = std::env::temp_dir().join(format!("{name}.xml"));
    std::fs::write(&xml, domain_xml(&name, &uuid)).unwrap();
    let _ = virsh(&["destroy", &name]);
    virsh(&["create", &xml.to_string_lossy()]).unwrap_or_else(|e| panic!("create: {e}"));
    let _vm = Vm { name: name.clone() };
    assert!(
        !Path::new(&format!("/etc/libvirt/qemu/{name}.xml")).exists(),
        "{name} is not transient"
    );
    let start = Instant::now();
    let mut text = String::new();
    while start.elapsed() < Duration::from_secs(15) {
        text = exporter.get("/metrics");
        if parse_series(&text).keys().any(|k| {
            name_of(k) == "ceems_compute_unit_memory_used_bytes"
                && label_of(k, "uuid") == Some(uuid.as_str())
        }) {
            println!("transient {name} ({uuid}) is a unit");
            return;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    panic!("the transient VM {uuid} is not a unit:\n{text}");
}

/// Nova lists the VM as alice's server in physics; Keystone knows alice and bob.
fn cloud_stand_ins(uuid: &str) -> (common::http::TestServer, common::http::TestServer) {
    use common::http::{Request, Response, TestServer};
    use serde_json::json;
    let launched = jiff::Timestamp::now() - jiff::SignedDuration::from_secs(60);
    let server = json!({
        "id": uuid, "name": "lab-vm", "status": "ACTIVE", "tenant_id": "p1", "user_id": "u1",
        "created": launched.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "updated": launched.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
        "OS-SRV-USG:launched_at": launched.strftime("%Y-%m-%dT%H:%M:%S.000000").to_string(),
        "OS-SRV-USG:terminated_at": null, "OS-EXT-STS:power_state": 1, "metadata": {}, "tags": [],
        "flavor": {"vcpus": 1, "ram": 64, "disk": 0, "swap": "", "original_name": "m1.lab", "extra_specs": {}}
    });
    let nova = TestServer::start(
        false,
        std::sync::Arc::new(move |req: &Request| match req.target.contains("deleted=") {
            true => Response::json(200, json!({"servers": []})),
            false => Response::json(200, json!({"servers": [server.clone()]})),
        }),
    );
    let keystone = TestServer::start(
        false,
        std::sync::Arc::new(|req: &Request| match req.path() {
            "/v3/auth/tokens" => Response::raw(201, "").with_header("X-Subject-Token", "lab-token"),
            "/v3/users" => Response::json(
                200,
                json!({"users": [{"id": "u1", "name": "alice"}, {"id": "u2", "name": "bob"}]}),
            ),
            "/v3/users/u1/projects" => {
                Response::json(200, json!({"projects": [{"id": "p1", "name": "physics"}]}))
            }
            "/v3/users/u2/projects" => Response::json(
                200,
                json!({"projects": [{"id": "p2", "name": "chemistry"}]}),
            ),
            _ => Response::raw(404, "not found"),
        }),
    );
    (nova, keystone)
}

fn the_vm_as_a_clouds_server(exporter_port: u16, uuid: &str) {
    use std::os::unix::fs::PermissionsExt;
    let prometheus = common::lab::prometheus_scraping(exporter_port);
    let (nova, keystone) = cloud_stand_ins(uuid);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    // The servers drop to nobody.
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let config = dir.join("ceems.toml");
    std::fs::write(
        &config,
        format!(
            "[[stats-server.clusters]]\nid = \"cloud\"\nmanager = \"openstack\"\nprometheus-url = \"{}\"\n\
             openstack-compute-url = \"{}/v2.1\"\nopenstack-identity-url = \"{}\"\n\
             openstack-auth = {{ identity = {{ methods = [\"password\"], password = {{ user = {{ name = \"ceems\", password = \"lab\" }} }} }} }}\n",
            prometheus.url(),
            nova.url(),
            keystone.url()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let db = dir.join("db");
    let server = common::start_subcommand(
        "stats-server",
        dir,
        &[
            &format!("--config.file={}", config.display()),
            &format!("--storage.data.path={}", db.display()),
            "--storage.update-interval=2s",
            "--prometheus.cutoff=5s",
            "--prometheus.scrape-interval=1s",
            "--web.admin-users=root",
        ],
        &[],
    );
    let fields = "field=uuid&field=username&field=project&field=aggregates_status&field=total_cpu_seconds&field=avg_cpu_usage";
    let vm = || {
        common::api_get(
            &server,
            &format!("/api/v1/units?cluster_id=cloud&running&{fields}"),
            "alice",
        )["data"]
            .as_array()
            .and_then(|l| l.iter().find(|u| u["uuid"] == uuid).cloned())
    };
    common::lab::wait_until(
        "the VM's usage from Prometheus",
        Duration::from_secs(120),
        || vm().is_some_and(|u| u["total_cpu_seconds"].as_f64().is_some_and(|s| s > 0.0)),
    );
    let row = vm().unwrap();
    assert_eq!(
        (row["username"].as_str(), row["project"].as_str()),
        (Some("alice"), Some("physics")),
        "{row}"
    );
    assert!(row["avg_cpu_usage"]["global"].is_number(), "{row}");
    // bob sees none of it.
    let bobs = common::api_get(
        &server,
        &format!("/api/v1/units?cluster_id=cloud&running&{fields}"),
        "bob",
    );
    assert_eq!(bobs["data"].as_array().map(Vec::len), Some(0), "{bobs}");
    // The report: alice's, not bob's.
    let report = common::api_get(&server, &format!("/report/cloud/{uuid}.json"), "alice");
    assert_eq!(report["data"]["job"]["uuid"], uuid, "{report}");
    let bob_report = ureq::get(&server.url(&format!("/report/cloud/{uuid}.json")))
        .set("X-Grafana-User", "bob")
        .call();
    assert!(bob_report.is_err(), "bob read alice's VM's report");
    // ceems lb on the stats-server's database: alice's queries of the VM pass, bob's do not.
    let lb = common::start_subcommand(
        "lb",
        dir,
        &[
            &format!("--lb.backend=cloud={}", prometheus.url()),
            &format!("--storage.data.path={}", db.display()),
        ],
        &[],
    );
    let ask = |user: &str| {
        let url = format!(
            "http://127.0.0.1:{}/api/v1/query?query=ceems_compute_unit_cpu_user_seconds_total%7Buuid%3D%22{uuid}%22%7D",
            lb.port
        );
        match ureq::get(&url).set("X-Grafana-User", user).call() {
            Ok(r) => (200, r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap_or_default()),
            Err(e) => panic!("{e}"),
        }
    };
    let (status, body) = ask("alice");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(uuid), "alice got no series of her VM: {body}");
    assert_eq!(ask("bob").0, 403);
    println!("the VM as a cloud's server: {row}");
}
