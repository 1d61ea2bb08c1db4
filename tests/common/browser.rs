//! Debian's chromium, headless with JavaScript off, for the pages and mails the tests render.

use std::process::Command;

use super::ensure_tools;

pub fn chromium() -> Result<(), String> {
    ensure_tools(
        || {
            Command::new("chromium")
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        },
        &["chromium"],
        &[],
    )
}

/// Runs headless chromium on `url` with a throwaway profile whose content settings block
/// JavaScript. (`--blink-settings=scriptEnabled=false` would also stop headless chromium's own
/// `--dump-dom` and `--screenshot`.)
pub fn browse(url: &str, args: &[&str]) -> String {
    let profile = tempfile::tempdir().unwrap();
    std::fs::create_dir(profile.path().join("Default")).unwrap();
    std::fs::write(
        profile.path().join("Default/Preferences"),
        r#"{"profile":{"default_content_setting_values":{"javascript":2}}}"#,
    )
    .unwrap();
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(url)
        .output()
        .expect("run chromium");
    assert!(
        out.status.success(),
        "chromium {args:?} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Screenshots `url` at `size` (`W,H`) into the test target directory as `name`, checks it is
/// a PNG of at least `min_bytes` (a blank page is smaller), and returns its path.
pub fn screenshot(url: &str, size: &str, name: &str, min_bytes: usize) -> std::path::PathBuf {
    let png = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_file(&png);
    browse(
        url,
        &[
            &format!("--window-size={size}"),
            &format!("--screenshot={}", png.display()),
        ],
    );
    let bytes = std::fs::read(&png).expect("chromium wrote no screenshot");
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > min_bytes,
        "screenshot of {} bytes",
        bytes.len()
    );
    println!("screenshot: {}", png.display());
    png
}
