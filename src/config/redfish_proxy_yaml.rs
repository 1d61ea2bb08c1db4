//! CEEMS's `redfish_proxy` configuration file (YAML), read as the `redfish-proxy` table of the
//! shared loader, so that `--config.file=/etc/redfish_proxy/config.yml` works as CEEMS
//! documents it. Two keys are ours: `bmc_networks` and `trusted_proxies`.

use serde::Deserialize;
use toml::{Table, Value};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    redfish_config: Option<RedfishConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedfishConfig {
    #[serde(default)]
    web: Option<Web>,
    #[serde(default)]
    targets: Vec<Target>,
    /// Ours: where `X-Redfish-Url` may point when no target matches the client.
    #[serde(default)]
    bmc_networks: Vec<String>,
    /// Ours: front proxies whose `X-Real-IP`/`X-Forwarded-For` are believed.
    #[serde(default)]
    trusted_proxies: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Web {
    #[serde(default)]
    insecure_skip_verify: Option<bool>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Target {
    host_ip_addrs: Vec<String>,
    url: String,
}

/// The `redfish-proxy` table that CEEMS's YAML `text` means.
pub fn to_table(text: &str) -> Result<Table, String> {
    // An empty file (or one holding only comments) is a valid, empty configuration.
    let file: Option<File> = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let config = file.and_then(|f| f.redfish_config).unwrap_or_default();
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut redfish = Table::new();
    if let Some(skip) = config.web.and_then(|w| w.insecure_skip_verify) {
        redfish.insert("insecure-skip-verify".into(), Value::Boolean(skip));
    }
    if !config.targets.is_empty() {
        let targets = config
            .targets
            .into_iter()
            .map(|t| format!("{}={}", t.host_ip_addrs.join("+"), t.url))
            .collect();
        redfish.insert("targets".into(), strings(targets));
    }
    if !config.bmc_networks.is_empty() {
        redfish.insert("bmc-networks".into(), strings(config.bmc_networks));
    }
    let mut table = Table::new();
    table.insert("redfish".into(), Value::Table(redfish));
    if !config.trusted_proxies.is_empty() {
        let mut web = Table::new();
        web.insert("trusted-proxies".into(), strings(config.trusted_proxies));
        table.insert("web".into(), Value::Table(web));
    }
    Ok(table)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceems_documented_file_and_targets() {
        let t = to_table(
            "---\n# Conifguration file for redfish_proxy app\nredfish_config:\n  web:\n    insecure_skip_verify: true\n  targets:\n    - host_ip_addrs:\n        - 10.100.4.1\n        - 10.100.4.2\n      url: https://172.21.4.1\n",
        )
        .unwrap();
        assert_eq!(t["redfish"]["insecure-skip-verify"], Value::Boolean(true));
        assert_eq!(
            t["redfish"]["targets"],
            Value::Array(vec![Value::String(
                "10.100.4.1+10.100.4.2=https://172.21.4.1".into()
            )])
        );
    }

    #[test]
    fn our_keys_and_mistakes() {
        let t = to_table(
            "redfish_config:\n  bmc_networks: [10.1.0.0/16]\n  trusted_proxies: [10.0.0.1]\n",
        )
        .unwrap();
        assert_eq!(
            t["redfish"]["bmc-networks"][0].as_str(),
            Some("10.1.0.0/16")
        );
        assert_eq!(t["web"]["trusted-proxies"][0].as_str(), Some("10.0.0.1"));
        let e = to_table("redfish_config:\n  web:\n    insecure_skip_verfy: true\n").unwrap_err();
        assert!(e.contains("insecure_skip_verfy"), "{e}");
        assert!(to_table("").unwrap()["redfish"]
            .as_table()
            .unwrap()
            .is_empty());
    }
}
