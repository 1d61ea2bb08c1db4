//! Request targets as Go's servers take them. curl sends a URL's `"`, `<` and `>` as they
//! are (CEEMS's e2e script asks `query=avg_cpu_usage{uuid="1481510"}`), Go's server accepts
//! them, and hyper's URI parser refuses the whole request as "invalid URI". This reader sits
//! between the connection and hyper and percent-encodes those bytes in each request line's
//! target, which decodes to the same parameters. Everything else passes unchanged: the
//! headers, and bodies (by their Content-Length); after a chunked body or an upgrade the rest
//! of the connection passes as it is.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A header line longer than this ends the rewriting (hyper refuses such heads anyway).
const MAX_LINE_BYTES: usize = 16 << 10;
/// Longest method token looked for before the target.
const MAX_METHOD_BYTES: usize = 32;

#[derive(Debug, Clone, PartialEq)]
enum State {
    /// Before or in a request's method, up to the space before the target.
    Method(usize),
    /// In the request target, up to the space before the version.
    Target,
    /// In the header lines: the current one, and what the finished ones said of the body.
    Head {
        line: Vec<u8>,
        content_length: u64,
        chunked_or_upgrade: bool,
    },
    /// In a body of this many bytes still to come.
    Body(u64),
    /// The rest of the connection passes unchanged.
    Through,
}

/// What a target byte is sent as, where it is not sent as it is.
fn escaped(byte: u8) -> Option<&'static [u8]> {
    match byte {
        b'"' => Some(b"%22"),
        b'<' => Some(b"%3C"),
        b'>' => Some(b"%3E"),
        b'`' => Some(b"%60"),
        _ => None,
    }
}

impl State {
    /// Reads `input`, appending what hyper is to see to `out`.
    fn rewrite(&mut self, input: &[u8], out: &mut Vec<u8>) {
        let mut at = 0;
        while at < input.len() {
            match self {
                State::Through => {
                    out.extend_from_slice(&input[at..]);
                    return;
                }
                State::Body(left) => {
                    let n = usize::try_from(*left)
                        .unwrap_or(usize::MAX)
                        .min(input.len() - at);
                    out.extend_from_slice(&input[at..at + n]);
                    at += n;
                    *left -= n as u64;
                    if *left == 0 {
                        *self = State::Method(0);
                    }
                }
                State::Method(len) => {
                    let byte = input[at];
                    out.push(byte);
                    at += 1;
                    match byte {
                        // Empty lines before a request are allowed.
                        b'\r' | b'\n' if *len == 0 => {}
                        b' ' if *len > 0 => *self = State::Target,
                        _ if *len >= MAX_METHOD_BYTES || byte.is_ascii_whitespace() => {
                            *self = State::Through
                        }
                        _ => *len += 1,
                    }
                }
                State::Target => {
                    let byte = input[at];
                    at += 1;
                    match escaped(byte) {
                        Some(code) => out.extend_from_slice(code),
                        None => out.push(byte),
                    }
                    match byte {
                        b' ' => {
                            *self = State::Head {
                                line: Vec::new(),
                                content_length: 0,
                                chunked_or_upgrade: false,
                            }
                        }
                        // No version: not a request line hyper takes; it says so itself.
                        b'\r' | b'\n' => *self = State::Through,
                        _ => {}
                    }
                }
                State::Head {
                    line,
                    content_length,
                    chunked_or_upgrade,
                } => {
                    let byte = input[at];
                    out.push(byte);
                    at += 1;
                    if byte != b'\n' {
                        line.push(byte);
                        if line.len() > MAX_LINE_BYTES {
                            *self = State::Through;
                        }
                        continue;
                    }
                    let text = line.strip_suffix(b"\r").unwrap_or(line);
                    // The first line here is the request line's version: never empty.
                    if text.is_empty() {
                        *self = match (*chunked_or_upgrade, *content_length) {
                            (true, _) => State::Through,
                            (false, 0) => State::Method(0),
                            (false, n) => State::Body(n),
                        };
                        continue;
                    }
                    if let Some((name, value)) = std::str::from_utf8(text)
                        .ok()
                        .and_then(|t| t.split_once(':'))
                    {
                        let value = value.trim();
                        match name.trim().to_ascii_lowercase().as_str() {
                            "content-length" => match value.parse() {
                                Ok(n) => *content_length = n,
                                // hyper refuses it; nothing after it is a request to rewrite.
                                Err(_) => *chunked_or_upgrade = true,
                            },
                            "transfer-encoding" | "upgrade" => *chunked_or_upgrade = true,
                            _ => {}
                        }
                    }
                    line.clear();
                }
            }
        }
    }
}

/// What hyper is given of the bytes `input` of a connection, read in pieces of `step` bytes.
pub fn rewritten(input: &[u8], step: usize) -> Vec<u8> {
    let mut state = State::Method(0);
    let mut out = Vec::with_capacity(input.len());
    for piece in input.chunks(step.max(1)) {
        state.rewrite(piece, &mut out);
    }
    out
}

/// A server connection whose request targets are made acceptable to hyper (see the module).
pub struct LenientTarget<S> {
    inner: S,
    state: State,
    /// Rewritten bytes that did not fit the last read's buffer.
    pending: Vec<u8>,
    pending_at: usize,
}

impl<S> LenientTarget<S> {
    pub fn new(inner: S) -> LenientTarget<S> {
        LenientTarget {
            inner,
            state: State::Method(0),
            pending: Vec::new(),
            pending_at: 0,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for LenientTarget<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.pending_at < this.pending.len() {
            let n = buf.remaining().min(this.pending.len() - this.pending_at);
            buf.put_slice(&this.pending[this.pending_at..this.pending_at + n]);
            this.pending_at += n;
            return Poll::Ready(Ok(()));
        }
        if this.state == State::Through {
            return Pin::new(&mut this.inner).poll_read(cx, buf);
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        let fresh = &buf.filled()[before..];
        let mut out = Vec::with_capacity(fresh.len());
        this.state.rewrite(fresh, &mut out);
        if out.as_slice() != fresh {
            buf.set_filled(before);
            let n = buf.remaining().min(out.len());
            buf.put_slice(&out[..n]);
            this.pending = out;
            this.pending_at = n;
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for LenientTarget<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(input: &[u8], step: usize) -> Vec<u8> {
        rewritten(input, step)
    }

    #[test]
    fn a_raw_quote_in_the_target_is_encoded_and_nothing_else_changes() {
        let request =
            b"GET /api/v1/query?query=avg_cpu_usage{uuid=\"1481510\"}&time=1 HTTP/1.1\r\n\
            Host: x\r\nX-Grafana-User: \"usr1\"\r\n\r\n";
        let want = b"GET /api/v1/query?query=avg_cpu_usage{uuid=%221481510%22}&time=1 HTTP/1.1\r\n\
            Host: x\r\nX-Grafana-User: \"usr1\"\r\n\r\n";
        for step in [1, 2, 7, request.len()] {
            assert_eq!(seen(request, step), want.to_vec(), "in pieces of {step}");
        }
    }

    #[test]
    fn a_body_passes_unchanged_and_the_next_request_is_rewritten() {
        let body = "query=up{uuid=\"1\"} <a>";
        let two = format!(
            "POST /q HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}GET /?a=\"b\" HTTP/1.1\r\n\r\n",
            body.len()
        );
        let want = format!(
            "POST /q HTTP/1.1\r\ncontent-length: {}\r\n\r\n{body}GET /?a=%22b%22 HTTP/1.1\r\n\r\n",
            body.len()
        );
        for step in [1, 3, two.len()] {
            assert_eq!(seen(two.as_bytes(), step), want.as_bytes(), "{step}");
        }
    }

    #[test]
    fn after_a_chunked_body_or_an_upgrade_nothing_is_rewritten() {
        for header in ["Transfer-Encoding: chunked", "Upgrade: websocket"] {
            let input = format!("POST / HTTP/1.1\r\n{header}\r\n\r\n3\r\n\"x\"\r\nGET /\"");
            assert_eq!(seen(input.as_bytes(), 4), input.as_bytes(), "{header}");
        }
    }

    #[test]
    fn what_is_not_a_request_line_passes_as_it_is() {
        for input in [
            &b"\x16\x03\x01\x02\x00\x01\"<>"[..],
            b"AVERYLONGMETHODNAMETHATISNOTHTTPATALL /\" HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(seen(input, 3), input);
        }
        assert_eq!(
            seen(b"\r\nGET /<x> HTTP/1.1\r\n\r\n", 5),
            b"\r\nGET /%3Cx%3E HTTP/1.1\r\n\r\n"
        );
    }

    proptest::proptest! {
        /// Any bytes, read in any pieces, give the same output, which is the input with only
        /// target bytes expanded: never shorter, and unchanged without `"`, `<`, `>` or `` ` ``.
        #[test]
        fn any_bytes_in_any_pieces(input in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400), step in 1usize..40) {
            let whole = rewritten(&input, input.len());
            proptest::prop_assert_eq!(rewritten(&input, step), whole.clone());
            proptest::prop_assert!(whole.len() >= input.len());
            if !input.iter().any(|b| b"\"<>`".contains(b)) {
                proptest::prop_assert_eq!(whole, input);
            }
        }

        /// Requests made of request-ish pieces keep every header and body byte.
        #[test]
        fn requests_keep_their_heads_and_bodies(targets in proptest::collection::vec("[a-z/?=&{}\"<>`]{1,20}", 1..4), body in "[a-z\"<>]{0,30}", step in 1usize..17) {
            let mut input = String::new();
            for t in &targets {
                input.push_str(&format!("POST /{t} HTTP/1.1\r\nContent-Length: {}\r\n\r\n{body}", body.len()));
            }
            let out = String::from_utf8(rewritten(input.as_bytes(), step)).unwrap();
            proptest::prop_assert_eq!(out.matches(&format!("\r\n\r\n{body}")).count(), targets.len());
            for line in out.split("\r\n").filter(|l| l.starts_with("POST ")) {
                proptest::prop_assert!(!line.contains(['"', '<', '>', '`']), "{}", line);
            }
        }
    }

    #[tokio::test]
    async fn bytes_that_do_not_fit_the_read_come_in_the_next() {
        use tokio::io::AsyncReadExt;
        let input: &[u8] = b"GET /?q=\"\"\"\"\"\" HTTP/1.1\r\n\r\n";
        let mut reader = LenientTarget::new(input);
        let mut got = Vec::new();
        let mut small = [0u8; 4];
        loop {
            let n = reader.read(&mut small).await.unwrap();
            if n == 0 {
                break;
            }
            got.extend_from_slice(&small[..n]);
        }
        assert_eq!(got, b"GET /?q=%22%22%22%22%22%22 HTTP/1.1\r\n\r\n");
    }
}
