//! Debian's munged started by a test with a key and socket of its own, and credentials made
//! with it as a given user.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

/// A munged of the test's own, with its own key and socket in `dir`.
pub struct Munged {
    _child: super::KillOnDrop,
    pub socket: std::path::PathBuf,
}

pub fn munged(dir: &Path) -> Munged {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let key = dir.join("munge.key");
    let made = Command::new("mungekey")
        .args([
            "--create",
            "--bits=1024",
            &format!("--keyfile={}", key.display()),
        ])
        .status()
        .expect("mungekey (Debian's munge) is needed");
    assert!(made.success());
    let socket = dir.join("socket");
    let child = Command::new("munged")
        .args(["--foreground", "--force"])
        .arg(format!("--key-file={}", key.display()))
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--pid-file={}", dir.join("pid").display()))
        .arg(format!("--seed-file={}", dir.join("seed").display()))
        .arg(format!("--log-file={}", dir.join("log").display()))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let start = std::time::Instant::now();
    while !socket.exists() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "munged did not start"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Munged {
        _child: super::KillOnDrop(child),
        socket,
    }
}

/// A credential made by `user` with munged at `socket` for `request`, living `ttl` seconds.
pub fn credential(user: &str, socket: &Path, request: &str, ttl: u32) -> String {
    let out = Command::new("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--init-groups",
            "munge",
        ])
        .arg(format!("--socket={}", socket.display()))
        .arg(format!("--string={request}"))
        .arg(format!("--ttl={ttl}"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}
