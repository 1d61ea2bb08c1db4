//! Stamps the build with its git revision, branch and rustc version, for
//! `ceems_exporter_build_info` and `ceems --version`. A source tree without git (a release
//! tarball) says "unknown" unless the packager sets CEEMS_REVISION and CEEMS_BRANCH.

use std::path::Path;
use std::process::Command;

fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// git in this package's own checkout; None elsewhere, such as a tarball unpacked inside
/// another repository.
fn git(args: &[&str]) -> Option<String> {
    let dir = std::env::var("CARGO_MANIFEST_DIR").ok()?;
    let top = output("git", &["-C", &dir, "rev-parse", "--show-toplevel"])?;
    let same = |a: &str, b: &str| match (Path::new(a).canonicalize(), Path::new(b).canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if !same(&top, &dir) {
        return None;
    }
    let mut all = vec!["-C", dir.as_str()];
    all.extend_from_slice(args);
    output("git", &all)
}

/// Reruns this script when HEAD moves: HEAD itself (a checkout), the branch's ref (a commit),
/// or packed-refs when the ref is packed. Only files that exist are named, since cargo reruns
/// a script whose named file is missing on every build.
fn watch_head() {
    let Some(head) = git(&["rev-parse", "--git-path", "HEAD"]) else {
        return;
    };
    let dir = std::env::var("CARGO_MANIFEST_DIR").unwrap_or_default();
    let in_repo = |p: &str| Path::new(&dir).join(p);
    println!("cargo:rerun-if-changed={}", in_repo(&head).display());
    if let Some(name) = git(&["symbolic-ref", "-q", "HEAD"]) {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            if in_repo(&path).exists() {
                println!("cargo:rerun-if-changed={}", in_repo(&path).display());
            }
        }
    }
    if let Some(packed) = git(&["rev-parse", "--git-path", "packed-refs"]) {
        if in_repo(&packed).exists() {
            println!("cargo:rerun-if-changed={}", in_repo(&packed).display());
        }
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=CEEMS_REVISION");
    println!("cargo:rerun-if-env-changed=CEEMS_BRANCH");
    watch_head();
    let revision = std::env::var("CEEMS_REVISION")
        .ok()
        .or_else(|| git(&["rev-parse", "--short", "HEAD"]))
        .unwrap_or_else(|| "unknown".to_owned());
    let branch = std::env::var("CEEMS_BRANCH")
        .ok()
        .or_else(|| git(&["symbolic-ref", "-q", "--short", "HEAD"]))
        // A detached checkout (CI, a tag) is on no branch.
        .or_else(|| git(&["rev-parse", "HEAD"]).map(|_| "HEAD".to_owned()))
        .unwrap_or_else(|| "unknown".to_owned());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    // "rustc 1.95.0 (59807616e 2026-04-14)" -> "1.95.0"
    let rust_version = output(&rustc, &["--version"])
        .and_then(|v| v.split_whitespace().nth(1).map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=CEEMS_REVISION={revision}");
    println!("cargo:rustc-env=CEEMS_BRANCH={branch}");
    println!("cargo:rustc-env=CEEMS_RUSTC={rust_version}");
}
