//! Parsers for the output of iproute2's `rdma` tool: `resource show mr|cq|qp`, `statistic qp
//! mode` and `statistic qp show`. Lines start with `dev <device>` or `link <device>/<port>`
//! and go on in `key value` pairs; other lines (the `LQPN: <…>` continuations) are skipped.
//! None of them panics, whatever the input.

use crate::host::ParseError;

/// One RDMA resource (a memory region, completion queue or queue pair) as `rdma resource show`
/// lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub device: String,
    /// The port of a `link` line; empty for `dev` lines.
    pub port: String,
    /// The owning process; `None` for the kernel's own resources (`comm [ib_core]`).
    pub pid: Option<u32>,
    /// The size the resource's kind counts: `mrlen` of an MR, `cqe` of a CQ, 0 for a QP.
    pub size: u64,
}

/// Which resources `rdma resource show <kind>` lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    MemoryRegion,
    CompletionQueue,
    QueuePair,
}

impl ResourceKind {
    /// The `rdma resource show` argument.
    pub fn arg(self) -> &'static str {
        match self {
            ResourceKind::MemoryRegion => "mr",
            ResourceKind::CompletionQueue => "cq",
            ResourceKind::QueuePair => "qp",
        }
    }

    /// The key of the size this kind counts.
    fn size_key(self) -> Option<&'static str> {
        match self {
            ResourceKind::MemoryRegion => Some("mrlen"),
            ResourceKind::CompletionQueue => Some("cqe"),
            ResourceKind::QueuePair => None,
        }
    }
}

/// The first two words of a resource line and the rest: `dev mlx5_0 …` or `link mlx5_0/1 …`.
struct Head<'a> {
    device: &'a str,
    port: &'a str,
    rest: Vec<&'a str>,
}

fn head(line: &str) -> Option<Head<'_>> {
    let mut words = line.split_ascii_whitespace();
    let kind = words.next()?;
    let name = words.next()?;
    let (device, port) = match kind {
        "dev" => (name, ""),
        "link" => name.split_once('/').unwrap_or((name, "")),
        _ => return None,
    };
    Some(Head {
        device,
        port,
        rest: words.collect(),
    })
}

/// The word after the first `key` of `rest`, parsed as a number.
fn number_after<T: std::str::FromStr>(
    line: usize,
    rest: &[&str],
    key: &str,
) -> Result<Option<T>, ParseError> {
    let Some(at) = rest.iter().position(|w| *w == key) else {
        return Ok(None);
    };
    let Some(raw) = rest.get(at + 1) else {
        return Err(ParseError::new(line, format!("`{key}` has no value")));
    };
    raw.parse()
        .map(Some)
        .map_err(|_| ParseError::new(line, format!("`{key}` is `{raw}`, not a number")))
}

/// `rdma resource show <kind>`.
pub fn resources(text: &str, kind: ResourceKind) -> Result<Vec<Resource>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(h) = head(line) else {
            continue;
        };
        let size = match kind.size_key() {
            Some(key) => number_after(i + 1, &h.rest, key)?.unwrap_or(0),
            None => 0,
        };
        out.push(Resource {
            device: h.device.to_owned(),
            port: h.port.to_owned(),
            pid: number_after(i + 1, &h.rest, "pid")?,
            size,
        });
    }
    Ok(out)
}

/// Whether a link counts its queue pairs per process on its own (`statistic qp mode`):
/// `link mlx5_0/1 qp auto type,pid on` or `… qp auto off`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkMode {
    /// `<device>/<port>`.
    pub link: String,
    pub per_process: bool,
}

/// `rdma statistic qp mode`. Only Mellanox (`mlx*`) devices count per process, so only their
/// links are listed; a line without `auto` says nothing of the mode and is skipped.
pub fn qp_modes(text: &str) -> Vec<LinkMode> {
    text.lines()
        .filter_map(|line| {
            let mut words = line.split_ascii_whitespace();
            if words.next()? != "link" {
                return None;
            }
            let link = words.next()?;
            if !link.starts_with("mlx") {
                return None;
            }
            let mut rest = words.skip_while(|w| *w != "auto");
            rest.next()?;
            let mode = rest.next()?;
            Some(LinkMode {
                link: link.to_owned(),
                per_process: mode != "off",
            })
        })
        .collect()
}

/// The hardware counters of a process's queue pairs that CEEMS exports.
pub const QP_COUNTERS: &[&str] = &[
    "rx_write_requests",
    "rx_read_requests",
    "rx_atomic_requests",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
];

/// One counter object of `rdma statistic qp show`: a process's queue pairs on one link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpCounters {
    pub device: String,
    pub port: String,
    pub pid: u32,
    /// Values in the order of [`QP_COUNTERS`]; 0 where the line lacks one.
    pub values: [u64; QP_COUNTERS.len()],
}

/// `rdma statistic qp show`; counter objects without a process are skipped.
pub fn qp_counters(text: &str) -> Result<Vec<QpCounters>, ParseError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let Some(h) = head(line) else {
            continue;
        };
        let Some(pid) = number_after(i + 1, &h.rest, "pid")? else {
            continue;
        };
        let mut values = [0; QP_COUNTERS.len()];
        for (slot, name) in values.iter_mut().zip(QP_COUNTERS) {
            *slot = number_after(i + 1, &h.rest, name)?.unwrap_or(0);
        }
        out.push(QpCounters {
            device: h.device.to_owned(),
            port: h.port.to_owned(),
            pid,
            values,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn memory_regions_with_their_owner_and_length() {
        let text = "dev mlx5_0 mrn 4 mrlen 2097152 pdn 9 pid 46231 comm ib_write_bw\n\
                    dev mlx5_0 mrn 1 mrlen 4096 pdn 0 comm [ib_core]\n";
        let got = resources(text, ResourceKind::MemoryRegion).unwrap();
        assert_eq!(
            got[0],
            Resource {
                device: "mlx5_0".into(),
                port: String::new(),
                pid: Some(46231),
                size: 2097152
            }
        );
        assert_eq!(got[1].pid, None);
    }

    #[test]
    fn queue_pairs_carry_their_port_and_continuations_are_skipped() {
        let text = "link mlx5_0/1 lqpn 813 rqpn 814 type RC state RTS pdn 8 pid 46231 comm ib_write_bw\n    LQPN: <813,816>\nlink mlx5_0/- lqpn 0 type SMI state RTS sq-psn 0 comm [ib_core]\n";
        let got = resources(text, ResourceKind::QueuePair).unwrap();
        assert_eq!(got.len(), 2);
        assert_eq!((got[0].port.as_str(), got[0].pid), ("1", Some(46231)));
        assert_eq!((got[1].port.as_str(), got[1].pid), ("-", None));
    }

    #[test]
    fn malformed_numbers_are_errors_that_name_the_line() {
        let e = resources(
            "dev mlx5_0 cqn 1\ndev mlx5_0 cqe x pid 1\n",
            ResourceKind::CompletionQueue,
        )
        .unwrap_err();
        assert_eq!(e.line, 2);
        assert!(resources("dev m pid", ResourceKind::QueuePair).is_err());
    }

    #[test]
    fn modes_only_of_mellanox_links_that_say_auto() {
        let text = "link mlx5_0/1 qp auto type,pid on\nlink mlx5_1/1 qp auto off\nlink hfi1_0/1 qp auto off\nlink mlx5_2/1 cntn 4 pid 1\n";
        assert_eq!(
            qp_modes(text),
            vec![
                LinkMode {
                    link: "mlx5_0/1".into(),
                    per_process: true
                },
                LinkMode {
                    link: "mlx5_1/1".into(),
                    per_process: false
                },
            ]
        );
    }

    #[test]
    fn qp_counters_per_process_object() {
        let text = "link mlx5_0/1 cntn 5 qp-type RC pid 46235 comm ib_write_bw rx_write_requests 41988882 rx_read_requests 0 out_of_buffer 0\n    LQPN: <814,815>\nlink mlx5_0/1 cntn 6 qp-type RC comm [ib_core] rx_write_requests 3\n";
        let got = qp_counters(text).unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].pid, got[0].values[0]), (46235, 41988882));
        assert_eq!(got[0].values[1..], [0; QP_COUNTERS.len() - 1]);
    }

    proptest! {
        #[test]
        fn parsers_never_panic(s in "(dev|link|pid|mrlen|cqe| |[a-z0-9_/]{1,6}|\n){0,40}") {
            for kind in [ResourceKind::MemoryRegion, ResourceKind::CompletionQueue, ResourceKind::QueuePair] {
                let _ = resources(&s, kind);
            }
            let _ = qp_modes(&s);
            let _ = qp_counters(&s);
        }
    }
}
