//! `nvidia-smi --query --xml-format`: the GPUs, their MIG instances and the instances' SMs.

use serde::Deserialize;

use super::{finish, full_gpu_sm_count, GpuDevice, GpuError};

#[derive(Debug, Deserialize)]
struct Log {
    #[serde(rename = "gpu", default)]
    gpus: Vec<Gpu>,
}

#[derive(Debug, Deserialize)]
struct Gpu {
    #[serde(rename = "@id", default)]
    id: String,
    #[serde(default)]
    product_name: String,
    uuid: String,
    minor_number: String,
    #[serde(default)]
    mig_mode: Option<MigMode>,
    #[serde(default)]
    mig_devices: Option<MigDevices>,
    #[serde(default)]
    gpu_virtualization_mode: Option<VirtualizationMode>,
}

#[derive(Debug, Deserialize)]
struct VirtualizationMode {
    #[serde(default)]
    virtualization_mode: String,
}

#[derive(Debug, Deserialize)]
struct MigMode {
    #[serde(default)]
    current_mig: String,
}

#[derive(Debug, Deserialize)]
struct MigDevices {
    #[serde(rename = "mig_device", default)]
    devices: Vec<MigDevice>,
}

#[derive(Debug, Deserialize)]
struct MigDevice {
    index: String,
    gpu_instance_id: String,
    #[serde(default)]
    device_attributes: Option<Attributes>,
}

#[derive(Debug, Deserialize)]
struct Attributes {
    #[serde(default)]
    shared: Option<Shared>,
}

#[derive(Debug, Deserialize)]
struct Shared {
    #[serde(default)]
    multiprocessor_count: Option<String>,
}

fn number(what: &str, text: &str) -> Result<u32, GpuError> {
    text.trim().parse().map_err(|_| GpuError::Parse {
        tool: "nvidia-smi",
        message: format!("{what} `{}` is not a number", text.trim()),
    })
}

/// The XML without its prolog: the `<?xml …?>` declaration and the DOCTYPE are skipped, so a
/// declaration with unquoted attributes (`<?xml version=1.0 ?>`, seen in CEEMS's test
/// capture) is accepted.
fn body(xml: &str) -> &str {
    let mut rest = xml.trim_start_matches('\u{feff}').trim_start();
    loop {
        if let Some(r) = rest.strip_prefix("<?") {
            rest = r
                .split_once("?>")
                .map(|(_, r)| r)
                .unwrap_or("")
                .trim_start();
        } else if let Some(r) = rest.strip_prefix("<!DOCTYPE") {
            rest = r.split_once('>').map(|(_, r)| r).unwrap_or("").trim_start();
        } else if let Some(r) = rest.strip_prefix("<!--") {
            rest = r
                .split_once("-->")
                .map(|(_, r)| r)
                .unwrap_or("")
                .trim_start();
        } else {
            return rest;
        }
    }
}

/// The devices of an `nvidia-smi --query --xml-format` document, MIG instances in place of
/// their GPU.
pub fn parse(xml: &str) -> Result<Vec<GpuDevice>, GpuError> {
    let log: Log = quick_xml::de::from_str(body(xml)).map_err(|e| GpuError::Parse {
        tool: "nvidia-smi",
        message: format!("not an nvidia_smi_log document: {e}"),
    })?;
    let mut gpus = Vec::with_capacity(log.gpus.len());
    for g in log.gpus {
        let minor = number("minor_number", &g.minor_number)?;
        gpus.push((minor, g));
    }
    gpus.sort_by_key(|(minor, _)| *minor);
    let mut devices = Vec::new();
    for (minor, g) in gpus {
        let mig = g
            .mig_mode
            .as_ref()
            .is_some_and(|m| m.current_mig.trim() == "Enabled");
        let instances = g.mig_devices.map(|m| m.devices).unwrap_or_default();
        let bus_id = g.id.trim().to_owned();
        let vgpu = g
            .gpu_virtualization_mode
            .is_some_and(|v| v.virtualization_mode.trim() == "VGPU");
        if mig && !instances.is_empty() {
            let mut parsed = Vec::new();
            for m in instances {
                let index = number("mig_device index", &m.index)?;
                let sm = m
                    .device_attributes
                    .and_then(|a| a.shared)
                    .and_then(|s| s.multiprocessor_count)
                    .and_then(|c| c.trim().parse().ok());
                parsed.push((index, number("gpu_instance_id", &m.gpu_instance_id)?, sm));
            }
            parsed.sort_by_key(|p| p.0);
            for (_, gi, sm) in parsed {
                devices.push(GpuDevice {
                    index: 0,
                    minor,
                    uuid: g.uuid.trim().to_owned(),
                    gpu_instance_id: Some(gi),
                    instance_uuid: None,
                    sm_count: sm,
                    fraction: 1.0,
                    model: g.product_name.trim().to_owned(),
                    bus_id: bus_id.clone(),
                    vgpu,
                });
            }
        } else {
            devices.push(GpuDevice {
                index: 0,
                minor,
                uuid: g.uuid.trim().to_owned(),
                gpu_instance_id: None,
                instance_uuid: None,
                sm_count: full_gpu_sm_count(&g.product_name),
                fraction: 1.0,
                model: g.product_name.trim().to_owned(),
                bus_id,
                vgpu,
            });
        }
    }
    Ok(finish(devices))
}

/// One physical GPU of `nvidia-smi vgpu --query`: its PCI address and the mdev UUIDs of its
/// vGPUs, each with the MIG instance it runs on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VgpuHost {
    pub bus_id: String,
    pub mdevs: Vec<(String, Option<u32>)>,
}

/// `nvidia-smi vgpu --query`: `GPU <bus id>` lines, then each vGPU's indented `MDEV UUID`
/// and `GPU Instance ID` (`N/A` on a GPU without MIG).
pub fn parse_vgpu_query(text: &str) -> Result<Vec<VgpuHost>, GpuError> {
    let bad = |n: usize, m: String| GpuError::Parse {
        tool: "nvidia-smi vgpu",
        message: format!("line {}: {m}", n + 1),
    };
    let mut hosts: Vec<VgpuHost> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if let Some(bus) = line.strip_prefix("GPU ") {
            hosts.push(VgpuHost {
                bus_id: bus.trim().to_owned(),
                mdevs: Vec::new(),
            });
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match key {
            "MDEV UUID" => {
                let host = hosts
                    .last_mut()
                    .ok_or_else(|| bad(n, "an MDEV UUID before any `GPU` line".into()))?;
                host.mdevs.push((value.to_owned(), None));
            }
            "GPU Instance ID" if value != "N/A" => {
                let gi = value
                    .parse()
                    .map_err(|_| bad(n, format!("GPU Instance ID `{value}` is not a number")))?;
                let mdev = hosts
                    .last_mut()
                    .and_then(|h| h.mdevs.last_mut())
                    .ok_or_else(|| bad(n, "a GPU Instance ID before its MDEV UUID".into()))?;
                mdev.1 = Some(gi);
            }
            _ => {}
        }
    }
    Ok(hosts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture() -> String {
        std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
                "tests/fixtures/compat/fixtures/nvidia-smi/nvidia-smi_--query_--xml-format.xml",
            ),
        )
        .unwrap()
    }

    #[test]
    fn ceems_capture_with_its_unquoted_prolog_gives_twelve_devices() {
        let d = parse(&fixture()).unwrap();
        assert_eq!(d.len(), 12, "{d:#?}");
        let summary: Vec<(usize, u32, Option<u32>)> = d
            .iter()
            .map(|d| (d.index, d.minor, d.gpu_instance_id))
            .collect();
        assert_eq!(
            summary,
            [
                (0, 0, None),
                (1, 1, None),
                (2, 2, Some(1)),
                (3, 2, Some(5)),
                (4, 2, Some(13)),
                (5, 3, Some(1)),
                (6, 3, Some(5)),
                (7, 3, Some(6)),
                (8, 4, None),
                (9, 5, None),
                (10, 6, None),
                (11, 7, None),
            ]
        );
        // 42 of the 70 SMs of GPU 2's instances; 14 of 70.
        assert!((d[2].fraction - 0.6).abs() < 1e-9);
        assert!((d[3].fraction - 0.2).abs() < 1e-9);
        assert_eq!(d[2].sm_count, Some(42));
        assert_eq!(d[0].sm_count, Some(108), "an A100");
        assert_eq!(d[0].uuid, "GPU-f124aa59-d406-d45b-9481-8fcd694e6c9e");
    }

    #[test]
    fn a_well_formed_prolog_and_bad_documents() {
        let xml = r#"<?xml version="1.0" ?>
<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">
<nvidia_smi_log><gpu id="0"><product_name>NVIDIA H100 80GB HBM3</product_name><uuid>GPU-1</uuid><minor_number>0</minor_number>
<mig_mode><current_mig>N/A</current_mig></mig_mode></gpu></nvidia_smi_log>"#;
        let d = parse(xml).unwrap();
        assert_eq!((d.len(), d[0].sm_count), (1, Some(132)));
        assert_eq!(parse("<nvidia_smi_log></nvidia_smi_log>").unwrap(), []);
        for bad in [
            "",
            "not xml",
            "<nvidia_smi_log><gpu><uuid>x</uuid><minor_number>zero</minor_number></gpu></nvidia_smi_log>",
            "<nvidia_smi_log><gpu><uuid>x</uuid></gpu></nvidia_smi_log>",
            "<nvidia_smi_log><gpu>",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.to_string().starts_with("nvidia-smi: "), "{bad}: {e}");
        }
    }
}
