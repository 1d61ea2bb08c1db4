//! The Redfish collector against stand-in BMCs over real HTTP(S): sessions and their renewal,
//! basic auth, each power model of the DMTF schema, TLS, and failures.

mod common;

use std::time::Duration;

use ceems::collect::redfish::{RedfishCollector, WebConfig};
use ceems::collect::{CollectError, Collector};
use ceems::metrics::MetricSet;
use common::bmc::{Flavor, PowerModel, StandinBmc};

fn config(bmc: &StandinBmc, extra: &str) -> WebConfig {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("redfish.yml");
    let protocol = if bmc.tls { "https" } else { "http" };
    std::fs::write(
        &path,
        format!(
            "redfish_web_config:\n  protocol: {protocol}\n  hostname: 127.0.0.1\n  port: {}\n  username: admin\n  password: secret\n  timeout: 2s\n{extra}",
            bmc.port
        ),
    )
    .unwrap();
    WebConfig::load(&path).unwrap()
}

fn dmtf(model: PowerModel, sessions: bool) -> Flavor {
    Flavor::Dmtf {
        model,
        credentials: ("admin".into(), "secret".into()),
        sessions,
    }
}

fn scrape(c: &RedfishCollector) -> (Result<(), CollectError>, String) {
    let mut set = MetricSet::new();
    let r = c.collect(&mut set);
    let mut text = String::new();
    set.encode_text(&mut text);
    (r, text)
}

#[test]
fn session_token_is_reused_and_renewed_after_a_401() {
    let bmc = StandinBmc::start(dmtf(PowerModel::Legacy, true), false);
    let c = RedfishCollector::new(&config(&bmc, "  use_session_token: true\n"), "n", "n").unwrap();
    let (r, text) = scrape(&c);
    r.unwrap();
    assert!(
        text.contains("ceems_redfish_power_current_watts{chassis=\"1U\",hostname=\"n\"} 420\n"),
        "{text}"
    );
    assert!(text.contains("ceems_redfish_power_min_watts{chassis=\"1U\",hostname=\"n\"} 400\n"));
    bmc.set_watts(500.0);
    let (r, text) = scrape(&c);
    r.unwrap();
    assert!(text.contains("} 500\n"), "{text}");
    assert_eq!(bmc.logins(), 1, "the token was not reused");
    // Every request after the login carried the token, none the password.
    let seen = bmc.seen();
    assert!(seen
        .iter()
        .filter(|s| s.method == "GET" && s.path() != "/redfish/v1/")
        .all(
            |s| s.headers.contains_key("x-auth-token") && !s.headers.contains_key("authorization")
        ));

    bmc.expire_sessions();
    bmc.set_watts(510.0);
    let (r, text) = scrape(&c);
    r.unwrap();
    assert!(text.contains("} 510\n"), "{text}");
    assert_eq!(bmc.logins(), 2, "no new session after the 401");

    drop(c);
    assert_eq!(
        bmc.live_sessions(),
        0,
        "the session was not deleted on shutdown"
    );
}

#[test]
fn basic_auth_when_the_bmc_has_no_sessions_or_none_is_asked_for() {
    for (sessions, ask) in [(false, true), (true, false)] {
        let bmc = StandinBmc::start(dmtf(PowerModel::Legacy, sessions), false);
        let extra = format!("  use_session_token: {ask}\n");
        let c = RedfishCollector::new(&config(&bmc, &extra), "n", "n").unwrap();
        let (r, text) = scrape(&c);
        r.unwrap();
        assert!(
            text.contains("current_watts{chassis=\"1U\",hostname=\"n\"} 420\n"),
            "{text}"
        );
        assert_eq!(bmc.logins(), 0);
    }
}

#[test]
fn wrong_credentials_fail_with_the_status() {
    let bmc = StandinBmc::start(
        Flavor::Dmtf {
            model: PowerModel::Legacy,
            credentials: ("admin".into(), "other".into()),
            sessions: true,
        },
        false,
    );
    let c = RedfishCollector::new(&config(&bmc, "  use_session_token: true\n"), "n", "n").unwrap();
    let (r, _) = scrape(&c);
    let err = r.unwrap_err().to_string();
    assert!(err.contains("401"), "{err}");
}

#[test]
fn newer_power_resources() {
    for (model, want) in [
        (PowerModel::Environment, "} 420\n"),
        (PowerModel::Subsystem, "} 420\n"),
    ] {
        let bmc = StandinBmc::start(dmtf(model, true), false);
        let c =
            RedfishCollector::new(&config(&bmc, "  use_session_token: true\n"), "n", "n").unwrap();
        let (r, text) = scrape(&c);
        r.unwrap();
        assert!(
            text.contains(&format!(
                "ceems_redfish_power_current_watts{{chassis=\"1U\",hostname=\"n\"{want}"
            )),
            "{model:?}: {text}"
        );
        assert!(!text.contains("min_watts"), "{model:?} has no min: {text}");
    }
}

#[test]
fn tls_needs_skip_verify_for_a_self_signed_bmc() {
    let bmc = StandinBmc::start(dmtf(PowerModel::Legacy, true), true);
    let strict = RedfishCollector::new(&config(&bmc, ""), "n", "n").unwrap();
    let err = scrape(&strict).0.unwrap_err().to_string();
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    let lax = RedfishCollector::new(
        &config(
            &bmc,
            "  insecure_skip_verify: true\n  use_session_token: true\n",
        ),
        "n",
        "n",
    )
    .unwrap();
    let (r, text) = scrape(&lax);
    r.unwrap();
    assert!(text.contains("} 420\n"), "{text}");
}

#[test]
fn a_slow_bmc_times_out_and_the_last_values_are_served_as_stale() {
    let bmc = StandinBmc::start(dmtf(PowerModel::Legacy, true), false);
    let c = RedfishCollector::new(
        &config(&bmc, "  use_session_token: true\n").with_timeout(Duration::from_millis(300)),
        "n",
        "n",
    )
    .unwrap();
    scrape(&c).0.unwrap();
    bmc.set_delay(Duration::from_secs(2));
    let start = std::time::Instant::now();
    let (r, text) = scrape(&c);
    assert!(
        start.elapsed() < Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );
    assert!(matches!(r, Err(CollectError::Stale(_))), "{r:?}");
    assert!(text.contains("} 420\n"), "{text}");
}

#[test]
fn the_shipped_example_config_loads() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/redfish.yml");
    let cfg = WebConfig::load(&path).unwrap();
    assert_eq!(cfg.bmc_url("cn042"), "https://cn042-bmc:443");
    assert!(cfg.use_session_token && !cfg.insecure_skip_verify);
}
