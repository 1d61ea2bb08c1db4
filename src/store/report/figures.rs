//! The report's energy and emissions lines: a figure no power source measured is said to be
//! missing, and what would measure it, never shown as 0.

use serde_json::Value;

/// What to turn on when a job has no power figure.
pub(super) const NO_POWER_DATA: &str = "no power data: enable a power collector on the exporter (ipmi, redfish, rapl, hwmon or cray_pm_counters) and load ceems-host-power.rules.yml in Prometheus";

/// What to turn on when a job has power but no emissions figure.
const NO_EMISSIONS_DATA: &str =
    "no emissions data: enable the exporter's emissions collector on one node";

/// A plain number, or the one value of a CEEMS series object (`{"total": 1.2}`); None when
/// the job has no such figure (absent or null).
pub(super) fn figure(job: &Value, key: &str) -> Option<f64> {
    let v = &job[key];
    v.as_f64()
        .or_else(|| v.as_object()?.values().next()?.as_f64())
}

/// The job's energy line and emissions line.
pub(super) fn energy_and_emissions(job: &Value) -> (String, String) {
    let parts: Vec<String> = [
        ("host", "total_host_energy_usage_kwh"),
        ("CPU packages", "total_cpu_package_energy_kwh"),
        ("GPU", "total_gpu_energy_usage_kwh"),
    ]
    .iter()
    .filter_map(|(name, key)| figure(job, key).map(|kwh| format!("{name} {kwh:.3} kWh")))
    .collect();
    let energy = match parts.is_empty() {
        true => NO_POWER_DATA.to_owned(),
        false => parts.join(", "),
    };
    let emissions = match (figure(job, "total_emissions_gms"), parts.is_empty()) {
        (Some(g), _) => format!("{g:.1} g CO2e"),
        (None, true) => "no emissions data (no power data)".to_owned(),
        (None, false) => NO_EMISSIONS_DATA.to_owned(),
    };
    (energy, emissions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn missing_figures_are_named_not_zero() {
        let none = json!({"total_host_energy_usage_kwh": null, "total_emissions_gms": null,
                          "total_cpu_package_energy_kwh": null});
        let (energy, emissions) = energy_and_emissions(&none);
        assert!(energy.starts_with("no power data"), "{energy}");
        assert!(!energy.contains("0.000"), "{energy}");
        assert!(emissions.starts_with("no emissions data"), "{emissions}");
        let power = json!({"total_host_energy_usage_kwh": 1.5, "total_emissions_gms": null,
                           "total_gpu_energy_usage_kwh": {"total": 0.25}});
        let (energy, emissions) = energy_and_emissions(&power);
        assert_eq!(energy, "host 1.500 kWh, GPU 0.250 kWh");
        assert!(emissions.contains("emissions collector"), "{emissions}");
        let all = json!({"total_host_energy_usage_kwh": 0.0, "total_emissions_gms": 0.0});
        assert_eq!(
            energy_and_emissions(&all),
            ("host 0.000 kWh".to_owned(), "0.0 g CO2e".to_owned())
        );
    }
}
