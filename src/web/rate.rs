//! CEEMS's per-client request rate (`--web.max-requests`: requests a minute from one client
//! address, answered 429 beyond it), with the addresses it does not count
//! (`--web.trusted-ip-prefix`, CIDR). The client is the peer: headers that name another
//! address (`X-Real-IP`, `X-Forwarded-For`) are anyone's to write, so they choose nothing.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use ipnet::IpNet;

/// The window a rate is counted over.
const WINDOW: Duration = Duration::from_secs(60);
/// Clients remembered before the ones whose window ended are forgotten.
const PRUNE_AT: usize = 10_000;

#[derive(Debug)]
pub struct RateLimit {
    per_window: u32,
    exempt: Vec<IpNet>,
    windows: Mutex<HashMap<IpAddr, (Instant, u32)>>,
}

/// A refusal: how long until the client's window ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryAfter(pub Duration);

impl RateLimit {
    /// `per_minute` requests a minute from each address outside `exempt`.
    pub fn new(per_minute: u32, exempt: Vec<IpNet>) -> RateLimit {
        RateLimit {
            per_window: per_minute,
            exempt,
            windows: Mutex::new(HashMap::new()),
        }
    }

    /// Counts one request from `peer` at `now`; Err when it is over the rate.
    pub fn admit(&self, peer: IpAddr, now: Instant) -> Result<(), RetryAfter> {
        // IPv4 clients on a dual-stack socket show up as ::ffff:a.b.c.d.
        let peer = match peer {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(peer),
            v4 => v4,
        };
        if self.exempt.iter().any(|n| n.contains(&peer)) {
            return Ok(());
        }
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if windows.len() >= PRUNE_AT {
            windows.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
        }
        let (start, count) = windows.entry(peer).or_insert((now, 0));
        if now.duration_since(*start) >= WINDOW {
            *start = now;
            *count = 0;
        }
        if *count >= self.per_window {
            return Err(RetryAfter(
                WINDOW.saturating_sub(now.duration_since(*start)),
            ));
        }
        *count += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_client_has_its_rate_and_trusted_prefixes_none() {
        let limit = RateLimit::new(3, vec!["10.1.0.0/16".parse().unwrap()]);
        let t0 = Instant::now();
        let (a, b): (IpAddr, IpAddr) = ("192.0.2.1".parse().unwrap(), "192.0.2.2".parse().unwrap());
        for _ in 0..3 {
            assert_eq!(limit.admit(a, t0), Ok(()));
        }
        let refused = limit.admit(a, t0 + Duration::from_secs(20));
        assert_eq!(refused, Err(RetryAfter(Duration::from_secs(40))));
        // Another client is counted apart, and the same one as an IPv4-mapped address not.
        assert_eq!(limit.admit(b, t0), Ok(()));
        assert!(limit
            .admit("::ffff:192.0.2.1".parse().unwrap(), t0)
            .is_err());
        // A new minute, a new count.
        assert_eq!(limit.admit(a, t0 + WINDOW), Ok(()));
        // A trusted prefix is never counted.
        let grafana: IpAddr = "10.1.4.2".parse().unwrap();
        for _ in 0..100 {
            assert_eq!(limit.admit(grafana, t0), Ok(()));
        }
    }
}
