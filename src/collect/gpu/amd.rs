//! AMD GPUs: `rocm-smi --showproductname --showserial --showbus --csv`, or `amd-smi list --json`.

use serde::Deserialize;

use super::{finish, GpuDevice, GpuError};

fn bad(tool: &'static str, message: String) -> GpuError {
    GpuError::Parse { tool, message }
}

/// rocm-smi's CSV: a header naming `device`, `Serial Number` and `Card series` (or `Card
/// model`), then one `card<N>,…` line per GPU.
pub fn parse_rocm_smi_csv(text: &str) -> Result<Vec<GpuDevice>, GpuError> {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| bad("rocm-smi", "empty output".into()))?
        .split(',')
        .map(str::trim)
        .collect();
    let column = |name: &str| header.iter().position(|h| h.eq_ignore_ascii_case(name));
    let device = column("device")
        .ok_or_else(|| bad("rocm-smi", format!("no `device` column in {header:?}")))?;
    let serial = column("Serial Number").ok_or_else(|| {
        bad(
            "rocm-smi",
            format!("no `Serial Number` column in {header:?}"),
        )
    })?;
    let model = column("Card series").or_else(|| column("Card model"));
    let mut devices = Vec::new();
    for (n, line) in lines.enumerate() {
        let cells: Vec<&str> = line.split(',').map(str::trim).collect();
        let cell = |i: usize| cells.get(i).copied();
        let name =
            cell(device).ok_or_else(|| bad("rocm-smi", format!("line {}: no device", n + 2)))?;
        let minor: u32 = name
            .strip_prefix("card")
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| {
                bad(
                    "rocm-smi",
                    format!("line {}: device `{name}` is not card<N>", n + 2),
                )
            })?;
        let uuid = cell(serial)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| bad("rocm-smi", format!("line {}: no serial number", n + 2)))?;
        devices.push(GpuDevice {
            index: 0,
            minor,
            uuid: uuid.to_owned(),
            gpu_instance_id: None,
            instance_uuid: None,
            sm_count: model.and_then(cell).and_then(compute_units),
            fraction: 1.0,
            model: model.and_then(cell).unwrap_or_default().to_owned(),
            bus_id: String::new(),
            vgpu: false,
        });
    }
    devices.sort_by_key(|d| d.minor);
    Ok(finish(devices))
}

/// Compute units of one device (one GCD: rocm-smi lists each die of an MI250 as a card) by
/// model, for `ceems_compute_unit_gpu_sm_count`; rocm-smi's CSV does not give them.
pub fn compute_units(model: &str) -> Option<u32> {
    const TABLE: &[(&str, u32)] = &[
        ("MI355X", 256),
        ("MI350X", 256),
        ("MI325X", 304),
        ("MI300X", 304),
        ("MI300A", 228),
        ("MI250X", 110),
        ("MI250", 104),
        ("MI210", 104),
        ("MI100", 120),
        ("MI60", 64),
        ("MI50", 60),
    ];
    let model = model.to_ascii_uppercase();
    TABLE
        .iter()
        .find(|(name, _)| model.contains(name))
        .map(|(_, n)| *n)
}

#[derive(Debug, Deserialize)]
struct AmdSmiGpu {
    gpu: u32,
    #[serde(default)]
    uuid: String,
    #[serde(default)]
    bdf: String,
}

/// `amd-smi list --json`: `[{"gpu": 0, "bdf": "0000:c5:00.0", "uuid": "…"}, …]`.
pub fn parse_amd_smi_json(text: &str) -> Result<Vec<GpuDevice>, GpuError> {
    let gpus: Vec<AmdSmiGpu> =
        serde_json::from_str(text).map_err(|e| bad("amd-smi", format!("not a GPU list: {e}")))?;
    let mut devices: Vec<GpuDevice> = gpus
        .into_iter()
        .map(|g| GpuDevice {
            index: 0,
            minor: g.gpu,
            uuid: if g.uuid.is_empty() {
                g.bdf.clone()
            } else {
                g.uuid
            },
            gpu_instance_id: None,
            instance_uuid: None,
            sm_count: None,
            fraction: 1.0,
            model: String::new(),
            bus_id: g.bdf,
            vgpu: false,
        })
        .collect();
    devices.sort_by_key(|d| d.minor);
    Ok(finish(devices))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceems_rocm_smi_capture() {
        let text = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(
                "tests/fixtures/compat/fixtures/rocm-smi/rocm-smi_--showproductname_--showserial_--showbus_--csv.txt",
            ),
        )
        .unwrap();
        let d = parse_rocm_smi_csv(&text).unwrap();
        let ids: Vec<(usize, &str)> = d.iter().map(|d| (d.index, d.uuid.as_str())).collect();
        assert_eq!(
            ids,
            [
                (0, "20170000800c"),
                (1, "20170003580c"),
                (2, "20180003050c"),
                (3, "20170005280c")
            ]
        );
        assert!(d[0].model.contains("MI50"));
        assert_eq!(d[0].sm_count, Some(60), "an MI50 has 60 compute units");
    }

    #[test]
    fn compute_units_of_instinct_models() {
        assert_eq!(compute_units("AMD Instinct MI300X"), Some(304));
        assert_eq!(compute_units("AMD INSTINCT MI250X"), Some(110));
        assert_eq!(compute_units("AMD Instinct MI250"), Some(104));
        assert_eq!(compute_units("Radeon RX 7900 XTX"), None);
    }

    #[test]
    fn malformed_rocm_smi_and_amd_smi() {
        for bad in [
            "",
            "device,PCI Bus\ncard0,0000:C5:00.0",
            "device,Serial Number\ngpu0,123",
            "device,Serial Number\ncard0,",
        ] {
            assert!(parse_rocm_smi_csv(bad).is_err(), "{bad:?}");
        }
        let d = parse_amd_smi_json(
            r#"[{"gpu": 1, "bdf": "0000:c8:00.0", "uuid": "b"}, {"gpu": 0, "bdf": "0000:c5:00.0", "uuid": "a", "kfd_id": 1}]"#,
        )
        .unwrap();
        assert_eq!((d[0].uuid.as_str(), d[0].index, d[1].minor), ("a", 0, 1));
        assert!(parse_amd_smi_json("{}").is_err());
        assert!(parse_amd_smi_json(r#"[{"bdf": "x"}]"#).is_err());
    }
}
