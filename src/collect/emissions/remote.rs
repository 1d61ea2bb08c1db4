//! Real-time emission factors from remote services, each refreshed on its own background thread
//! and never inside a scrape: RTE's eCO2mix (France), Electricity Maps, WattTime.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::Factor;

pub const RTE_URL: &str =
    "https://odre.opendatasoft.com/api/explore/v2.1/catalog/datasets/eco2mix-national-tr/records";
pub const EMAPS_URL: &str = "https://api.electricitymap.org/v3";
pub const WATTTIME_URL: &str = "https://api.watttime.org";
/// WattTime reports marginal emissions in lbs/MWh.
const LBS_PER_MWH_TO_G_PER_KWH: f64 = 0.453_592;
/// WattTime tokens last 30 minutes; renew a little before.
const WATTTIME_TOKEN_LIFE: Duration = Duration::from_secs(25 * 60);
const MAX_BODY: u64 = 1 << 20;

/// A service that gives emission factors.
pub trait RemoteProvider: Send + 'static {
    fn id(&self) -> &'static str;
    fn name(&self) -> &'static str;
    fn fetch(&mut self, agent: &ureq::Agent) -> Result<Vec<Factor>, String>;
}

fn get_json(req: ureq::Request) -> Result<Value, String> {
    let url = req.url().to_owned();
    let resp = req.call().map_err(|e| match e {
        ureq::Error::Status(code, _) => format!("{url}: HTTP {code}"),
        other => format!("{url}: {other}"),
    })?;
    let mut body = Vec::new();
    std::io::Read::read_to_end(
        &mut std::io::Read::take(resp.into_reader(), MAX_BODY),
        &mut body,
    )
    .map_err(|e| format!("{url}: reading body: {e}"))?;
    serde_json::from_slice(&body).map_err(|e| format!("{url}: body is not JSON: {e}"))
}

fn positive(v: Option<&Value>) -> Option<f64> {
    v.and_then(Value::as_f64)
        .filter(|x| x.is_finite() && *x >= 0.0)
}

/// `taux_co2` of the newest eCO2mix record.
pub fn parse_rte(doc: &Value) -> Result<f64, String> {
    let first = doc
        .get("results")
        .and_then(Value::as_array)
        .and_then(|r| r.first())
        .ok_or("no results in the eCO2mix answer")?;
    positive(first.get("taux_co2")).ok_or_else(|| "eCO2mix record has no taux_co2".into())
}

/// `carbonIntensity` of an Electricity Maps latest-intensity answer.
pub fn parse_emaps(doc: &Value) -> Result<f64, String> {
    positive(doc.get("carbonIntensity"))
        .ok_or_else(|| "Electricity Maps answer has no carbonIntensity".into())
}

/// The newest `value` (lbs/MWh) of a WattTime signal answer, in g/kWh.
pub fn parse_watttime(doc: &Value) -> Result<f64, String> {
    let last = doc
        .get("data")
        .and_then(Value::as_array)
        .and_then(|d| d.last())
        .ok_or("WattTime answer has no data")?;
    positive(last.get("value"))
        .map(|lbs| lbs * LBS_PER_MWH_TO_G_PER_KWH)
        .ok_or_else(|| "WattTime data point has no value".into())
}

pub struct Rte {
    pub url: String,
}

impl RemoteProvider for Rte {
    fn id(&self) -> &'static str {
        "rte"
    }
    fn name(&self) -> &'static str {
        "RTE eCO2 Mix"
    }
    fn fetch(&mut self, agent: &ureq::Agent) -> Result<Vec<Factor>, String> {
        let today = humantime::format_rfc3339_seconds(SystemTime::now()).to_string();
        let today = today.get(..10).unwrap_or("");
        let doc = get_json(
            agent
                .get(&self.url)
                .query("select", "taux_co2,date_heure")
                .query("order_by", "date_heure desc")
                .query("limit", "1")
                .query("timezone", "Europe/Paris")
                .query(
                    "where",
                    &format!("date_heure in [date'{today}' TO now()] and taux_co2 is not null"),
                ),
        )?;
        Ok(vec![Factor {
            country_code: "FR".into(),
            country: "France".into(),
            g_per_kwh: parse_rte(&doc)?,
        }])
    }
}

pub struct ElectricityMaps {
    pub url: String,
    pub token: String,
    pub zone: String,
    pub zone_name: String,
}

impl RemoteProvider for ElectricityMaps {
    fn id(&self) -> &'static str {
        "emaps"
    }
    fn name(&self) -> &'static str {
        "Electricity Maps"
    }
    fn fetch(&mut self, agent: &ureq::Agent) -> Result<Vec<Factor>, String> {
        let doc = get_json(
            agent
                .get(&format!("{}/carbon-intensity/latest", self.url))
                .query("zone", &self.zone)
                .set("auth-token", &self.token),
        )?;
        Ok(vec![Factor {
            country_code: self.zone.clone(),
            country: self.zone_name.clone(),
            g_per_kwh: parse_emaps(&doc)?,
        }])
    }
}

pub struct WattTime {
    pub url: String,
    pub username: String,
    pub password: String,
    pub region: String,
    token: Option<(String, std::time::Instant)>,
}

impl WattTime {
    pub fn new(url: String, username: String, password: String, region: String) -> WattTime {
        WattTime {
            url,
            username,
            password,
            region,
            token: None,
        }
    }

    fn token(&mut self, agent: &ureq::Agent) -> Result<String, String> {
        if let Some((t, at)) = &self.token {
            if at.elapsed() < WATTTIME_TOKEN_LIFE {
                return Ok(t.clone());
            }
        }
        use base64::Engine as _;
        let basic = base64::engine::general_purpose::STANDARD
            .encode(format!("{}:{}", self.username, self.password));
        let doc = get_json(
            agent
                .get(&format!("{}/login", self.url))
                .set("Authorization", &format!("Basic {basic}")),
        )?;
        let token = doc
            .get("token")
            .and_then(Value::as_str)
            .ok_or("WattTime login answered no token")?
            .to_owned();
        self.token = Some((token.clone(), std::time::Instant::now()));
        Ok(token)
    }
}

impl RemoteProvider for WattTime {
    fn id(&self) -> &'static str {
        "wt"
    }
    fn name(&self) -> &'static str {
        "Watt Time"
    }
    fn fetch(&mut self, agent: &ureq::Agent) -> Result<Vec<Factor>, String> {
        let token = self.token(agent)?;
        let now = SystemTime::now();
        let start = now - Duration::from_secs(15 * 60);
        let result = get_json(
            agent
                .get(&format!("{}/v3/historical", self.url))
                .query("region", &self.region)
                .query("signal_type", "co2_moer")
                .query(
                    "start",
                    &humantime::format_rfc3339_seconds(start).to_string(),
                )
                .query("end", &humantime::format_rfc3339_seconds(now).to_string())
                .set("Authorization", &format!("Bearer {token}")),
        );
        if result.as_ref().is_err_and(|e| e.contains("HTTP 401")) {
            // Expired early: log in again next time.
            self.token = None;
        }
        Ok(vec![Factor {
            country_code: self.region.clone(),
            country: self.region.clone(),
            g_per_kwh: parse_watttime(&result?)?,
        }])
    }
}

/// The latest factors of one remote provider, kept fresh by a background thread that stops
/// when this is dropped.
pub struct Refresher {
    pub id: &'static str,
    pub name: &'static str,
    latest: Arc<Mutex<Vec<Factor>>>,
    _stop: mpsc::Sender<()>,
}

impl Refresher {
    pub fn spawn(
        mut provider: Box<dyn RemoteProvider>,
        agent: ureq::Agent,
        interval: Duration,
    ) -> std::io::Result<Refresher> {
        let (id, name) = (provider.id(), provider.name());
        let latest = Arc::new(Mutex::new(Vec::new()));
        let (stop, stopped) = mpsc::channel::<()>();
        let shared = Arc::clone(&latest);
        std::thread::Builder::new()
            .name(format!("emissions-{id}"))
            .spawn(move || {
                let mut failing = false;
                loop {
                    match provider.fetch(&agent) {
                        Ok(f) => {
                            if failing {
                                tracing::info!(provider = id, "emission factor refreshed again");
                            }
                            failing = false;
                            *shared.lock().unwrap_or_else(|p| p.into_inner()) = f;
                        }
                        // Once per failure streak, so a dead service does not flood the log.
                        Err(error) if !failing => {
                            failing = true;
                            tracing::warn!(provider = id, %error, "cannot refresh emission factor; serving the last value");
                        }
                        Err(error) => {
                            tracing::debug!(provider = id, %error, "emission factor still not refreshed")
                        }
                    }
                    match stopped.recv_timeout(interval) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        _ => break,
                    }
                }
            })?;
        Ok(Refresher {
            id,
            name,
            latest,
            _stop: stop,
        })
    }

    pub fn latest(&self) -> Vec<Factor> {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn answers() {
        assert_eq!(
            parse_rte(
                &json!({"total_count": 1, "results": [{"taux_co2": 19, "date_heure": "2024-01-01T10:00:00+01:00"}]})
            ),
            Ok(19.0)
        );
        assert!(parse_rte(&json!({"results": []})).is_err());
        assert!(parse_rte(&json!({"results": [{"taux_co2": null}]})).is_err());
        assert_eq!(
            parse_emaps(&json!({"zone": "DE", "carbonIntensity": 302})),
            Ok(302.0)
        );
        assert!(parse_emaps(&json!({"error": "zone not found"})).is_err());
        let wt = parse_watttime(&json!({"data": [{"value": 900.0}, {"value": 1000.0}]})).unwrap();
        assert!((wt - 453.592).abs() < 1e-9);
        assert!(parse_watttime(&json!({"data": [], "meta": {"warnings": []}})).is_err());
        assert!(parse_watttime(&json!([])).is_err());
    }
}
