#![no_main]
//! Fuzzes the reader that makes request targets acceptable to hyper: any bytes, read in any
//! pieces, give the same output, and the output is the input with only the target's `"`, `<`,
//! `>` and `` ` `` percent-encoded (so it is never shorter, and unchanged without them).

use ceems::web::lenient_target::rewritten;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&step, input)) = data.split_first() else {
        return;
    };
    let whole = rewritten(input, input.len());
    assert_eq!(rewritten(input, usize::from(step)), whole);
    assert!(whole.len() >= input.len());
    if !input.iter().any(|b| b"\"<>`".contains(b)) {
        assert_eq!(whole, input);
    }
});
