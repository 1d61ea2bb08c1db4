//! CEEMS's `redfish_proxy` configuration file (YAML), read as the `redfish-proxy` table of the
//! shared loader, so that `--config.file=/etc/redfish_proxy/config.yml` works as CEEMS
//! documents it. Two keys are ours: `bmc_networks` and `trusted_proxies`.
//!
//! CEEMS v0.16 reads its settings under `redfish_proxy`; `redfish_config` (v0.10's name) is
//! still read, and said to be deprecated. `insecure_skip_verify` is taken where each version
//! put it: under `web` (v0.10), at the top (v0.16, deprecated there) and under `tls_config`.

use serde::Deserialize;
use toml::{Table, Value};

/// Where notes on deprecated keys travel to the loader, which logs them once logging is set.
pub const DEPRECATED_KEY: &str = "_deprecated";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    redfish_proxy: Option<RedfishConfig>,
    #[serde(default)]
    redfish_config: Option<RedfishConfig>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RedfishConfig {
    #[serde(default)]
    web: Option<Tls>,
    #[serde(default)]
    insecure_skip_verify: Option<bool>,
    #[serde(default)]
    tls_config: Option<Tls>,
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
struct Tls {
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
    let mut deprecated = Vec::new();
    let config = match file {
        Some(File {
            redfish_proxy: Some(_),
            redfish_config: Some(_),
        }) => {
            return Err(
                "both `redfish_proxy` and `redfish_config` are set: keep `redfish_proxy` \
                 (`redfish_config` is its deprecated name)"
                    .into(),
            )
        }
        Some(File {
            redfish_proxy: Some(c),
            ..
        }) => c,
        Some(File {
            redfish_config: Some(c),
            ..
        }) => {
            deprecated.push(
                "`redfish_config` is deprecated since CEEMS v0.16, use `redfish_proxy`".to_owned(),
            );
            c
        }
        _ => RedfishConfig::default(),
    };
    let strings = |v: Vec<String>| Value::Array(v.into_iter().map(Value::String).collect());
    let mut redfish = Table::new();
    let skip = [config.tls_config, config.web]
        .into_iter()
        .flatten()
        .filter_map(|t| t.insecure_skip_verify)
        .chain(config.insecure_skip_verify)
        .reduce(|a, b| a || b);
    if let Some(skip) = skip {
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
    if !deprecated.is_empty() {
        table.insert(DEPRECATED_KEY.into(), strings(deprecated));
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

    #[test]
    fn v0_16_section_name_and_where_it_puts_insecure_skip_verify() {
        let t = to_table(
            "redfish_proxy:\n  insecure_skip_verify: true\n  targets:\n    - host_ip_addrs: [192.168.1.0]\n      url: https://localhost:5000\n",
        )
        .unwrap();
        assert_eq!(t["redfish"]["insecure-skip-verify"], Value::Boolean(true));
        assert_eq!(
            t["redfish"]["targets"][0].as_str(),
            Some("192.168.1.0=https://localhost:5000")
        );
        assert!(t.get(DEPRECATED_KEY).is_none(), "{t:?}");
        let t =
            to_table("redfish_proxy:\n  tls_config:\n    insecure_skip_verify: true\n").unwrap();
        assert_eq!(t["redfish"]["insecure-skip-verify"], Value::Boolean(true));
        // v0.10's name still works, and is said to be deprecated.
        let t = to_table("redfish_config:\n  insecure_skip_verify: false\n").unwrap();
        assert_eq!(t["redfish"]["insecure-skip-verify"], Value::Boolean(false));
        assert!(t[DEPRECATED_KEY][0]
            .as_str()
            .is_some_and(|n| n.contains("use `redfish_proxy`")));
        let e = to_table("redfish_proxy: {}\nredfish_config: {}\n").unwrap_err();
        assert!(e.contains("both"), "{e}");
    }
}
