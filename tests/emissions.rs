//! The emissions collector against stand-ins of RTE's eCO2mix, Electricity Maps and WattTime on
//! 127.0.0.1: values refresh in the background, a provider that fails keeps its last value and
//! logs once, and a provider without credentials is skipped.

mod common;

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ceems::collect::emissions::{Credentials, EmissionsCollector, EmissionsConfig};
use ceems::collect::Collector;
use ceems::metrics::MetricSet;
use common::http::{Request, Response, TestServer};
use serde_json::json;

/// Everything logged by this test binary.
#[derive(Clone)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Capture {
    static LOGS: OnceLock<Capture> = OnceLock::new();
    LOGS.get_or_init(|| {
        let cap = Capture(Arc::new(Mutex::new(Vec::new())));
        let writer = cap.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::INFO)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let _ = tracing::subscriber::set_global_default(subscriber);
        cap
    })
}

fn log_text() -> String {
    String::from_utf8_lossy(&logs().0.lock().unwrap()).into_owned()
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Good,
    Garbage,
}

fn config(providers: &[&str], country: Option<&str>, creds: Credentials) -> EmissionsConfig {
    EmissionsConfig {
        providers: providers.iter().map(|s| (*s).to_owned()).collect(),
        country_code: country.map(str::to_owned),
        update_interval: Duration::from_millis(100),
        request_timeout: Duration::from_millis(300),
        rte_url: "http://127.0.0.1:1".into(),
        emaps_url: "http://127.0.0.1:1".into(),
        wt_url: "http://127.0.0.1:1".into(),
        credentials: creds,
    }
}

fn scrape(c: &EmissionsCollector) -> String {
    let mut set = MetricSet::new();
    c.collect(&mut set)
        .expect("the emissions collector never fails");
    let mut text = String::new();
    set.encode_text(&mut text);
    text
}

fn wait_for(c: &EmissionsCollector, wanted: &[&str]) -> String {
    let start = Instant::now();
    loop {
        let text = scrape(c);
        if wanted.iter().all(|w| text.contains(w)) {
            return text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never saw {wanted:?} in\n{text}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

const RTE_FR: &str = "ceems_emissions_gCo2_kWh{country=\"France\",country_code=\"FR\",provider=\"rte\",provider_name=\"RTE eCO2 Mix\"} 19\n";
const EMAPS_DE: &str = "ceems_emissions_gCo2_kWh{country=\"Germany\",country_code=\"DE\",provider=\"emaps\",provider_name=\"Electricity Maps\"} 302\n";
const WT: &str = "ceems_emissions_gCo2_kWh{country=\"CAISO_NORTH\",country_code=\"CAISO_NORTH\",provider=\"wt\",provider_name=\"Watt Time\"} 453.592\n";

#[test]
fn remote_providers_refresh_in_the_background_and_keep_their_last_value() {
    logs();
    let rte_mode = Arc::new(Mutex::new(Mode::Good));
    let m = Arc::clone(&rte_mode);
    let rte = TestServer::start(
        false,
        Arc::new(move |req: &Request| {
            assert!(req.target.contains("select=taux_co2"), "{}", req.target);
            match *m.lock().unwrap() {
                Mode::Good => Response::json(
                    200,
                    json!({"total_count": 1, "results": [{"date_heure": "2026-11-22T14:00:00+01:00", "taux_co2": 19}]}),
                ),
                Mode::Garbage => Response::raw(200, "<html>maintenance</html>"),
            }
        }),
    );
    let emaps = TestServer::start(
        false,
        Arc::new(|req: &Request| {
            if req.header("auth-token") != Some("em-token") {
                return Response::json(401, json!({"error": "bad token"}));
            }
            assert!(req.target.contains("zone=DE"), "{}", req.target);
            Response::json(
                200,
                json!({"zone": "DE", "carbonIntensity": 302, "datetime": "2026-11-22T14:00:00.000Z"}),
            )
        }),
    );
    let wt = TestServer::start(
        false,
        Arc::new(|req: &Request| match req.path() {
            // user:pass
            "/login" if req.header("authorization") == Some("Basic dXNlcjpwYXNz") => {
                Response::json(200, json!({"token": "wt-token"}))
            }
            "/v3/historical" if req.header("authorization") == Some("Bearer wt-token") => {
                Response::json(
                    200,
                    json!({"data": [{"point_time": "2026-11-22T13:55:00+00:00", "value": 900.0},
                                    {"point_time": "2026-11-22T14:00:00+00:00", "value": 1000.0}],
                           "meta": {"region": "CAISO_NORTH", "units": "lbs_co2_per_mwh"}}),
                )
            }
            _ => Response::json(401, json!({"error": "unauthorised"})),
        }),
    );
    let mut cfg = config(
        &["owid", "global", "rte", "emaps", "wt"],
        Some("de"),
        Credentials {
            emaps_token: Some("em-token".into()),
            wt_username: Some("user".into()),
            wt_password: Some("pass".into()),
            wt_region: Some("CAISO_NORTH".into()),
        },
    );
    cfg.rte_url = rte.url();
    cfg.emaps_url = emaps.url();
    cfg.wt_url = wt.url();
    let c = EmissionsCollector::new(&cfg).unwrap();
    let text = wait_for(&c, &[RTE_FR, EMAPS_DE, WT]);
    assert!(
        text.contains("country_code=\"ZZ\",provider=\"global\""),
        "{text}"
    );
    assert!(
        text.contains("country_code=\"DE\",provider=\"owid\""),
        "{text}"
    );
    assert!(
        !text.contains("country_code=\"FR\",provider=\"owid\""),
        "{text}"
    );

    // RTE starts answering garbage and Electricity Maps stops answering in time.
    *rte_mode.lock().unwrap() = Mode::Garbage;
    emaps.set_delay(Duration::from_secs(1));
    let rte_calls = rte.seen().len();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(rte.seen().len() >= rte_calls + 3, "RTE was not asked again");
    let text = scrape(&c);
    assert!(text.contains(RTE_FR), "{text}");
    assert!(text.contains(EMAPS_DE), "{text}");
    let logged = log_text();
    let count = |provider: &str| {
        logged
            .lines()
            .filter(|l| l.contains("cannot refresh emission factor") && l.contains(provider))
            .count()
    };
    assert_eq!(count("provider=\"rte\""), 1, "{logged}");
    assert_eq!(count("provider=\"emaps\""), 1, "{logged}");
    // WattTime logged in once and reused its token.
    let logins = wt.seen().iter().filter(|r| r.path() == "/login").count();
    assert_eq!(logins, 1);

    // The collector is dropped: the background threads stop asking.
    drop(c);
    std::thread::sleep(Duration::from_millis(300));
    let after = rte.seen().len();
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(
        rte.seen().len(),
        after,
        "refresh went on after the collector was dropped"
    );
}

#[test]
fn providers_without_credentials_are_skipped_and_bad_countries_refused() {
    logs();
    let c = EmissionsCollector::new(&config(
        &["emaps", "wt"],
        Some("FR"),
        Credentials::default(),
    ))
    .unwrap();
    assert_eq!(scrape(&c), "");
    let logged = log_text();
    assert!(logged.contains("EMAPS_API_TOKEN is not set"), "{logged}");
    assert!(logged.contains("WattTime is skipped"), "{logged}");

    let err = EmissionsCollector::new(&config(&["owid"], Some("XX"), Credentials::default()))
        .err()
        .unwrap();
    assert!(err.contains("XX"), "{err}");

    let all = EmissionsCollector::new(&config(&["owid"], None, Credentials::default())).unwrap();
    let text = scrape(&all);
    assert!(text.lines().count() > 150, "{text}");
}
