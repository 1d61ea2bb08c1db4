//! Which processes listen on a TCP port: `/proc/net/tcp{,6}` gives the listening sockets'
//! inodes, each process's `fd/` the sockets it holds. For `check-privileges`, which finds a
//! daemon's port taken and must say by whom.

use std::path::Path;

/// The inodes of the sockets listening on `port` in a `/proc/net/tcp` or `tcp6` table.
/// Lines that are not a socket's are skipped.
pub fn listening_inodes(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let (_, hex_port) = local.rsplit_once(':')?;
            let listening = fields.get(3) == Some(&LISTEN);
            let same_port = u16::from_str_radix(hex_port, 16).ok()? == port;
            (listening && same_port)
                .then(|| fields.get(9)?.parse::<u64>().ok())
                .flatten()
        })
        .filter(|inode| *inode != 0)
        .collect()
}

/// A process holding a listening socket: its pid and command line.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub pid: u32,
    pub argv: Vec<String>,
}

/// The processes (under `proc_root`) that hold a socket listening on TCP `port`. Processes
/// whose descriptors cannot be read (another user's, without privileges) are not seen.
pub fn holders(proc_root: &Path, port: u16) -> Vec<Holder> {
    let mut inodes = Vec::new();
    for table in ["net/tcp", "net/tcp6"] {
        if let Ok(text) = std::fs::read_to_string(proc_root.join(table)) {
            inodes.extend(listening_inodes(&text, port));
        }
    }
    if inodes.is_empty() {
        return Vec::new();
    }
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    let Ok(entries) = std::fs::read_dir(proc_root) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(entry.path().join("fd")) else {
            continue;
        };
        let holds = fds.flatten().any(|fd| {
            std::fs::read_link(fd.path())
                .is_ok_and(|target| wanted.iter().any(|w| target.as_os_str() == w.as_str()))
        });
        if holds {
            let argv = std::fs::read(entry.path().join("cmdline"))
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect()
                })
                .unwrap_or_default();
            found.push(Holder { pid, argv });
        }
    }
    found
}

impl Holder {
    /// Whether it is ceems running `subcommand`: `ceems SUBCOMMAND …`, or a link named after
    /// CEEMS's program (`link`, e.g. `ceems_exporter`).
    pub fn is_ceems(&self, subcommand: &str, link: &str) -> bool {
        let base = |a: &String| {
            Path::new(a)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        match self.argv.first().map(base).as_deref() {
            Some(name) if name == link => true,
            Some("ceems") => self.argv.get(1).is_some_and(|a| a == subcommand),
            _ => false,
        }
    }

    /// `NAME (pid N)`.
    pub fn describe(&self) -> String {
        let name = self.argv.first().map_or("?", String::as_str);
        format!("{name} (pid {})", self.pid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_sockets_of_a_port() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:2332 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0        0 41234 1 0000000000000000 100 0 0 10 0
   1: 0100007F:2332 0100007F:D2F4 01 00000000:00000000 00:00000000 00000000  0        0 41299 1 0000000000000000 20 4 30 10 -1
   2: 00000000:0016 00000000:0000 0A 00000000:00000000 00:00000000 00000000  0        0 1800 1 0000000000000000 100 0 0 10 0
   garbage line
";
        assert_eq!(listening_inodes(table, 9010), [41234]);
        assert_eq!(listening_inodes(table, 22), [1800]);
        assert!(listening_inodes(table, 9020).is_empty());
        assert!(listening_inodes("", 9010).is_empty());
    }

    #[test]
    fn ceems_by_subcommand_or_by_link() {
        let h = |argv: &[&str]| Holder {
            pid: 7,
            argv: argv.iter().map(|a| a.to_string()).collect(),
        };
        assert!(h(&["/usr/bin/ceems", "exporter", "--collector.slurm"])
            .is_ceems("exporter", "ceems_exporter"));
        assert!(h(&["/usr/local/bin/ceems_exporter"]).is_ceems("exporter", "ceems_exporter"));
        assert!(!h(&["/usr/bin/ceems", "lb"]).is_ceems("exporter", "ceems_exporter"));
        assert!(!h(&["/usr/bin/node_exporter"]).is_ceems("exporter", "ceems_exporter"));
        assert_eq!(
            h(&["/usr/bin/node_exporter"]).describe(),
            "/usr/bin/node_exporter (pid 7)"
        );
    }

    proptest::proptest! {
        #[test]
        fn tables_never_panic(text in "\\PC*", port in proptest::num::u16::ANY) {
            let _ = listening_inodes(&text, port);
        }
    }
}
