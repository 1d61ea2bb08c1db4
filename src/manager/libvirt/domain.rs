//! What a libvirt domain XML (`/etc/libvirt/qemu/<name>.xml`) says of a VM: its UUID (Nova's
//! instance UUID), its name, and the host devices passed to it: whole PCI devices, and mdev
//! devices such as NVIDIA vGPUs.

use serde::Deserialize;

use crate::host::gpu::pci_address;
use crate::host::ParseError;

/// A host device passed through to the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostDevice {
    /// A whole PCI function, as (domain, bus, device, function).
    Pci((u32, u32, u32, u32)),
    /// A mediated device by its UUID.
    Mdev(String),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Domain {
    pub uuid: String,
    pub name: String,
    pub host_devices: Vec<HostDevice>,
}

#[derive(Deserialize)]
struct DomainXml {
    #[serde(default)]
    name: String,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    devices: Option<DevicesXml>,
}

/// libvirt's runtime XML (`/run/libvirt/qemu/<name>.xml`): the live domain inside a status.
#[derive(Deserialize)]
struct DomstatusXml {
    domain: DomainXml,
}

#[derive(Deserialize)]
struct DevicesXml {
    #[serde(rename = "hostdev", default)]
    hostdevs: Vec<HostDevXml>,
}

#[derive(Deserialize)]
struct HostDevXml {
    #[serde(rename = "@type", default)]
    kind: String,
    #[serde(default)]
    source: Option<SourceXml>,
}

#[derive(Deserialize)]
struct SourceXml {
    #[serde(default)]
    address: Option<AddressXml>,
}

#[derive(Deserialize)]
struct AddressXml {
    #[serde(rename = "@uuid", default)]
    uuid: String,
    #[serde(rename = "@domain", default)]
    domain: String,
    #[serde(rename = "@bus", default)]
    bus: String,
    #[serde(rename = "@slot", default)]
    slot: String,
    #[serde(rename = "@function", default)]
    function: String,
}

/// Parses a domain XML. Host devices other than PCI and mdev (USB, SCSI) are left out; a
/// PCI address that is not one is an error.
pub fn parse(xml: &str) -> Result<Domain, ParseError> {
    let root_is_status = xml
        .split('<')
        .map(str::trim_start)
        .find(|tag| !tag.is_empty() && !tag.starts_with(['?', '!']))
        .is_some_and(|tag| tag.starts_with("domstatus"));
    let d: DomainXml = if root_is_status {
        quick_xml::de::from_str::<DomstatusXml>(xml).map(|s| s.domain)
    } else {
        quick_xml::de::from_str(xml)
    }
    .map_err(|e| ParseError::new(0, format!("not a libvirt domain: {e}")))?;
    let uuid = d.uuid.trim();
    if uuid.is_empty() || !uuid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
        return Err(ParseError::new(
            0,
            format!(
                "domain `{}` has no UUID, or `{uuid}` is not one",
                d.name.trim()
            ),
        ));
    }
    let mut host_devices = Vec::new();
    for h in d.devices.map(|d| d.hostdevs).unwrap_or_default() {
        let Some(a) = h.source.and_then(|s| s.address) else {
            continue;
        };
        match h.kind.as_str() {
            "pci" => {
                let text = format!("{}:{}:{}.{}", a.domain, a.bus, a.slot, a.function);
                let addr = pci_address(&text).ok_or_else(|| {
                    ParseError::new(0, format!("hostdev PCI address `{text}` is not one"))
                })?;
                host_devices.push(HostDevice::Pci(addr));
            }
            "mdev" if !a.uuid.trim().is_empty() => {
                host_devices.push(HostDevice::Mdev(a.uuid.trim().to_owned()))
            }
            _ => {}
        }
    }
    Ok(Domain {
        uuid: uuid.to_owned(),
        name: d.name.trim().to_owned(),
        host_devices,
    })
}

/// The domain name in a VM's cgroup directory name, with systemd
/// (`machine-qemu\x2d1\x2dinstance\x2d00000002.scope`) or without it
/// (`qemu-1-instance-00000002.libvirt-qemu`); None for other directories.
pub fn name_of_cgroup(dir: &str) -> Option<String> {
    let rest = if let Some(scope) = dir.strip_suffix(".scope") {
        unescape_systemd(scope.strip_prefix("machine-")?)?
            .strip_prefix("qemu-")?
            .to_owned()
    } else {
        dir.strip_suffix(".libvirt-qemu")?
            .strip_prefix("qemu-")?
            .to_owned()
    };
    // `<libvirt's domain id>-<name>`.
    let (id, name) = rest.split_once('-')?;
    (!id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty())
        .then(|| name.to_owned())
}

/// systemd's `\xNN` escapes undone.
fn unescape_systemd(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' {
            let hex = s
                .get(i + 2..i + 4)
                .filter(|_| bytes.get(i + 1) == Some(&b'x'))?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/compat/fixtures/qemu")
                .join(name),
        )
        .unwrap()
    }

    #[test]
    fn nova_domains_with_pci_and_mdev_gpus() {
        let d = parse(&fixture("instance-00000001.xml")).unwrap();
        assert_eq!(d.uuid, "b674a0a2-c300-4dc6-8c9c-65df16da6d69");
        assert_eq!(d.name, "instance-00000001");
        assert_eq!(
            d.host_devices,
            [
                HostDevice::Mdev("c73f1fa6-489e-4834-9476-d70dabd98c40".into()),
                HostDevice::Mdev("3b356d38-854e-48be-b376-00c72c7d119c".into()),
            ]
        );
        let d = parse(&fixture("instance-00000002.xml")).unwrap();
        assert_eq!(
            d.host_devices,
            [
                HostDevice::Pci((0, 0x15, 0, 0)),
                HostDevice::Pci((0, 0x83, 0, 0))
            ]
        );
        let d = parse(&fixture("instance-00000004.xml")).unwrap();
        assert!(d.host_devices.is_empty());
    }

    #[test]
    fn malformed_domains_are_errors() {
        for bad in [
            "",
            "<domain>",
            "<domain><name>x</name></domain>",
            "<domain><uuid>not a uuid!</uuid></domain>",
            "<domain><uuid>1-2</uuid><devices><hostdev type='pci'><source><address domain='0x0' bus='zz' slot='0' function='0'/></source></hostdev></devices></domain>",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn cgroup_directory_names() {
        assert_eq!(
            name_of_cgroup(r"machine-qemu\x2d1\x2dinstance\x2d00000002.scope").as_deref(),
            Some("instance-00000002")
        );
        assert_eq!(
            name_of_cgroup("qemu-12-my-vm.libvirt-qemu").as_deref(),
            Some("my-vm")
        );
        for other in [
            "system.slice",
            r"machine-lxc\x2d1\x2dbox.scope",
            r"machine-qemu\x2dx\x2dvm.scope",
            r"machine-qemu\x2d1.scope",
            r"machine-qemu\x2.scope",
            "qemu-1-.libvirt-qemu",
        ] {
            assert_eq!(name_of_cgroup(other), None, "{other}");
        }
    }

    proptest::proptest! {
        #[test]
        fn never_panic(s in "\\PC*") {
            let _ = parse(&s);
            let _ = name_of_cgroup(&s);
        }
    }
}
