//! What the collector takes from Redfish documents (DMTF schemas: ServiceRoot,
//! ChassisCollection, Chassis, Power, EnvironmentMetrics, PowerSubsystem, PowerSupply,
//! PowerSupplyMetrics). Each function reads a parsed JSON body and says what was missing.

use serde_json::Value;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ModelError(pub String);

fn link<'a>(doc: &'a Value, key: &str) -> Option<&'a str> {
    doc.get(key)?.get("@odata.id")?.as_str()
}

fn members(doc: &Value, what: &str) -> Result<Vec<String>, ModelError> {
    let list = doc
        .get("Members")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError(format!("{what} has no Members list")))?;
    Ok(list
        .iter()
        .filter_map(|m| m.get("@odata.id").and_then(Value::as_str))
        .map(str::to_owned)
        .collect())
}

/// Links of the service root that the collector follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRoot {
    pub chassis: String,
    pub sessions: Option<String>,
}

pub fn service_root(doc: &Value) -> Result<ServiceRoot, ModelError> {
    let chassis = link(doc, "Chassis")
        .ok_or_else(|| ModelError("service root has no Chassis link".into()))?
        .to_owned();
    let sessions = doc
        .get("Links")
        .and_then(|l| link(l, "Sessions"))
        .map(str::to_owned);
    Ok(ServiceRoot { chassis, sessions })
}

pub fn chassis_collection(doc: &Value) -> Result<Vec<String>, ModelError> {
    members(doc, "chassis collection")
}

/// Where a chassis says its power figures are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChassisLinks {
    pub id: String,
    pub power: Option<String>,
    pub environment_metrics: Option<String>,
    pub power_subsystem: Option<String>,
}

pub fn chassis(doc: &Value) -> Result<ChassisLinks, ModelError> {
    let id = doc
        .get("Id")
        .and_then(Value::as_str)
        .ok_or_else(|| ModelError("chassis has no Id".into()))?
        .to_owned();
    Ok(ChassisLinks {
        id,
        power: link(doc, "Power").map(str::to_owned),
        environment_metrics: link(doc, "EnvironmentMetrics").map(str::to_owned),
        power_subsystem: link(doc, "PowerSubsystem").map(str::to_owned),
    })
}

/// Watts of one chassis. The legacy Power resource gives all four; the newer resources give
/// only the current reading.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChassisPower {
    pub current: f64,
    pub min: f64,
    pub max: f64,
    pub avg: f64,
}

fn watts(v: Option<&Value>) -> f64 {
    v.and_then(Value::as_f64)
        .filter(|w| w.is_finite() && *w >= 0.0)
        .unwrap_or(0.0)
}

/// Sums `PowerControl[]` of a Power resource (one entry per power domain of the chassis).
pub fn power(doc: &Value) -> Result<ChassisPower, ModelError> {
    let controls = doc
        .get("PowerControl")
        .and_then(Value::as_array)
        .ok_or_else(|| ModelError("Power resource has no PowerControl list".into()))?;
    let mut p = ChassisPower::default();
    for c in controls {
        p.current += watts(c.get("PowerConsumedWatts"));
        let m = c.get("PowerMetrics");
        p.min += watts(m.and_then(|m| m.get("MinConsumedWatts")));
        p.max += watts(m.and_then(|m| m.get("MaxConsumedWatts")));
        p.avg += watts(m.and_then(|m| m.get("AverageConsumedWatts")));
    }
    Ok(p)
}

/// `PowerWatts.Reading` of an EnvironmentMetrics resource.
pub fn environment_power(doc: &Value) -> Result<f64, ModelError> {
    doc.get("PowerWatts")
        .and_then(|p| p.get("Reading"))
        .and_then(Value::as_f64)
        .filter(|w| w.is_finite() && *w >= 0.0)
        .ok_or_else(|| ModelError("EnvironmentMetrics has no PowerWatts.Reading".into()))
}

/// The PowerSupplies collection link of a PowerSubsystem.
pub fn power_supplies(doc: &Value) -> Result<String, ModelError> {
    link(doc, "PowerSupplies")
        .map(str::to_owned)
        .ok_or_else(|| ModelError("PowerSubsystem has no PowerSupplies link".into()))
}

pub fn collection(doc: &Value) -> Result<Vec<String>, ModelError> {
    members(doc, "collection")
}

/// The Metrics link of a PowerSupply.
pub fn supply_metrics(doc: &Value) -> Option<String> {
    link(doc, "Metrics").map(str::to_owned)
}

/// `InputPowerWatts.Reading` of a PowerSupplyMetrics resource.
pub fn supply_input_power(doc: &Value) -> Result<f64, ModelError> {
    doc.get("InputPowerWatts")
        .and_then(|p| p.get("Reading"))
        .and_then(Value::as_f64)
        .filter(|w| w.is_finite() && *w >= 0.0)
        .ok_or_else(|| ModelError("PowerSupplyMetrics has no InputPowerWatts.Reading".into()))
}

/// `Chassis-1` → `Chassis_1`, as CEEMS labels chassis.
pub fn sanitize_id(id: &str) -> String {
    id.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> Value {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/compat/fixtures/redfish")
            .join(name);
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    }

    #[test]
    fn ceems_fixture_documents() {
        let root = service_root(&fixture("service_root.json")).unwrap();
        assert_eq!(root.chassis, "/redfish/v1/Chassis");
        assert_eq!(root.sessions.as_deref(), Some("/redfish/v1/Sessions"));
        assert_eq!(
            chassis_collection(&fixture("chassis_collection.json")).unwrap(),
            [
                "/redfish/v1/Chassis/Chassis-1",
                "/redfish/v1/Chassis/Chassis-2"
            ]
        );
        let c = chassis(&fixture("chassis_1.json")).unwrap();
        assert_eq!(c.id, "Chassis-1");
        assert_eq!(
            c.power.as_deref(),
            Some("/redfish/v1/Chassis/Chassis-1/Power")
        );
        assert_eq!(
            power(&fixture("chassis_1_power.json")).unwrap(),
            ChassisPower {
                current: 397.0,
                min: 326.0,
                max: 609.0,
                avg: 365.0
            }
        );
        assert_eq!(sanitize_id("Chassis-1"), "Chassis_1");
    }

    #[test]
    fn missing_parts_are_errors_not_panics() {
        assert!(service_root(&serde_json::json!({})).is_err());
        assert!(chassis(&serde_json::json!({"Id": 3})).is_err());
        assert!(power(&serde_json::json!({"PowerControl": {}})).is_err());
        assert!(environment_power(&serde_json::json!({"PowerWatts": {"Reading": -1}})).is_err());
        let p = power(&serde_json::json!({"PowerControl": [{"PowerConsumedWatts": "x"}]})).unwrap();
        assert_eq!(p.current, 0.0);
        assert_eq!(
            environment_power(&serde_json::json!({"PowerWatts": {"Reading": 512.5}})),
            Ok(512.5)
        );
    }
}
