#![no_main]
//! Fuzzes what PBS tells the stats-server: accounting log lines (and the rows made of them),
//! `qstat -f -F json` documents, and the sizes and durations both write.

use ceems::manager::openpbs::records;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut known = None;
    for line in text.lines() {
        if let Ok(Some(rec)) = records::parse_line(line) {
            let offset = rec.utc_offset().unwrap_or(0);
            let unit = records::unit_record(&rec, 1_795_651_300, -offset);
            if let Some(k) = &known {
                let _ = records::deleted(k, &rec, -offset);
            }
            known = Some(unit);
        }
    }
    let _ = records::parse_qstat(text, 1_795_651_300);
    let _ = records::size_bytes(text);
    let _ = records::duration_seconds(text);
});
