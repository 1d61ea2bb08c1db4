//! Real libvirt and KVM: start libvirtd (no systemd here, so libvirt uses its own `machine/`
//! cgroup layout), define a diskless domain carrying Nova's metadata, boot it (it idles in its
//! firmware) and scrape the `libvirt` collector: the VM is a unit with its instance UUID, CPU
//! seconds that grow and the memory its cgroup files hold; with perf and eBPF on, QEMU's
//! context switches and its firmware reads are counted for the VM.

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
}
