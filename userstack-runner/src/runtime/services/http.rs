//! The http service: HTTP/1.1 (RFC 9112) with keep-alive, answering `GET` and `HEAD` for any
//! target with one static body and its exact `Content-Length`, `405` to other methods and
//! `400` to a malformed request (after which it closes, since the stream can no longer be
//! framed). Requests may be pipelined; a request body framed by `Content-Length` is skipped;
//! a chunked request body is refused with `400` (no client of this service sends one).

use super::Verdict;
use std::sync::Arc;

/// The longest request head accepted (request line plus headers); longer is `400`.
pub const MAX_HEAD: usize = 8192;

/// The responses a service sends, formatted once and shared by its sessions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponses {
    ok_head: Vec<u8>,
    ok_head_close: Vec<u8>,
    body: Vec<u8>,
    method_not_allowed: Vec<u8>,
    bad_request: Vec<u8>,
}

impl HttpResponses {
    /// The responses for a service whose body is `body`.
    pub fn new(body: &[u8]) -> HttpResponses {
        let head = |connection: &str| {
            format!(
                "HTTP/1.1 200 OK\r\nServer: hoststack-userstack\r\nContent-Type: text/plain\r\n\
                 Content-Length: {}\r\n{connection}\r\n",
                body.len()
            )
            .into_bytes()
        };
        let error = |status: &str, extra: &str| {
            format!(
                "HTTP/1.1 {status}\r\nServer: hoststack-userstack\r\n{extra}Content-Length: 0\r\n\
                 Connection: close\r\n\r\n"
            )
            .into_bytes()
        };
        HttpResponses {
            ok_head: head(""),
            ok_head_close: head("Connection: close\r\n"),
            body: body.to_vec(),
            method_not_allowed: error("405 Method Not Allowed", "Allow: GET, HEAD\r\n"),
            bad_request: error("400 Bad Request", ""),
        }
    }
}

/// Where a session is in its stream of requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Collecting a request head.
    Head,
    /// Skipping this many bytes of a request body.
    Body(u64),
    /// Answered with "close": everything further is ignored.
    Done,
}

/// One connection's HTTP state.
#[derive(Debug)]
pub struct Http {
    responses: Arc<HttpResponses>,
    head: Vec<u8>,
    phase: Phase,
}

/// A parsed request head: what the response depends on.
#[derive(Debug, PartialEq, Eq)]
struct Request {
    method_allowed: bool,
    head_only: bool,
    keep_alive: bool,
    body_len: u64,
}

fn is_token(s: &[u8]) -> bool {
    !s.is_empty()
        && s.iter()
            .all(|&c| c.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&c))
}

/// Parses a request head (without its final CRLF CRLF); `None` when malformed.
fn parse_head(head: &[u8]) -> Option<Request> {
    let mut lines = head
        .split(|&c| c == b'\n')
        .map(|line| line.strip_suffix(b"\r").unwrap_or(line));
    let request_line = lines.next()?;
    let mut parts = request_line.split(|&c| c == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !is_token(method) || target.is_empty() {
        return None;
    }
    if target.iter().any(|c| c.is_ascii_control()) {
        return None;
    }
    let http11 = match version {
        b"HTTP/1.1" => true,
        b"HTTP/1.0" => false,
        _ => return None,
    };
    let mut keep_alive = http11;
    let mut body_len = 0u64;
    let mut host = false;
    for line in lines {
        let colon = line.iter().position(|&c| c == b':')?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if !is_token(name) {
            return None;
        }
        let value = value.trim_ascii();
        if name.eq_ignore_ascii_case(b"content-length") {
            let text = std::str::from_utf8(value).ok()?;
            if text.is_empty() || !text.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            body_len = text.parse().ok()?;
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            return None;
        } else if name.eq_ignore_ascii_case(b"host") {
            host = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in value.split(|&c| c == b',') {
                let option = option.trim_ascii();
                if option.eq_ignore_ascii_case(b"close") {
                    keep_alive = false;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    keep_alive = true;
                }
            }
        }
    }
    // RFC 9112 section 3.2: a 1.1 request without Host is answered with 400.
    if http11 && !host {
        return None;
    }
    Some(Request {
        method_allowed: method == b"GET" || method == b"HEAD",
        head_only: method == b"HEAD",
        keep_alive,
        body_len,
    })
}

impl Http {
    /// A session answering with `responses`.
    pub fn new(responses: Arc<HttpResponses>) -> Http {
        Http {
            responses,
            head: Vec::new(),
            phase: Phase::Head,
        }
    }

    /// Takes request bytes and appends the responses they complete to `output`.
    pub fn on_input(&mut self, mut input: &[u8], output: &mut Vec<u8>) -> Verdict {
        while !input.is_empty() {
            match self.phase {
                Phase::Done => return Verdict::Close,
                Phase::Body(left) => {
                    let skip = usize::try_from(left).unwrap_or(usize::MAX).min(input.len());
                    input = &input[skip..];
                    self.phase = match left - skip as u64 {
                        0 => Phase::Head,
                        rest => Phase::Body(rest),
                    };
                }
                Phase::Head => {
                    // Look for the end of the head across the bytes we kept and the new ones.
                    let searched_from = self.head.len().saturating_sub(3);
                    let take = input.len().min(MAX_HEAD + 4 - self.head.len());
                    self.head.extend_from_slice(&input[..take]);
                    let end = self.head[searched_from..]
                        .windows(4)
                        .position(|w| w == b"\r\n\r\n")
                        .map(|p| searched_from + p);
                    match end {
                        Some(end) => {
                            let consumed_new = end + 4 - (self.head.len() - take);
                            input = &input[consumed_new..];
                            let request = parse_head(&self.head[..end]);
                            self.head.clear();
                            if self.respond(request, output) == Verdict::Close {
                                self.phase = Phase::Done;
                                return Verdict::Close;
                            }
                        }
                        None if self.head.len() > MAX_HEAD => {
                            self.head.clear();
                            self.respond(None, output);
                            self.phase = Phase::Done;
                            return Verdict::Close;
                        }
                        None => input = &input[take..],
                    }
                }
            }
        }
        if self.phase == Phase::Done {
            Verdict::Close
        } else {
            Verdict::KeepOpen
        }
    }

    /// The peer closed its side: a partial request is malformed.
    pub fn on_end(&mut self, output: &mut Vec<u8>) -> Verdict {
        if self.phase == Phase::Head && !self.head.is_empty() {
            self.head.clear();
            self.respond(None, output);
        }
        self.phase = Phase::Done;
        Verdict::Close
    }

    fn respond(&mut self, request: Option<Request>, output: &mut Vec<u8>) -> Verdict {
        let responses = &self.responses;
        let Some(request) = request else {
            output.extend_from_slice(&responses.bad_request);
            return Verdict::Close;
        };
        if !request.method_allowed {
            output.extend_from_slice(&responses.method_not_allowed);
            return Verdict::Close;
        }
        if request.keep_alive {
            output.extend_from_slice(&responses.ok_head);
        } else {
            output.extend_from_slice(&responses.ok_head_close);
        }
        if !request.head_only {
            output.extend_from_slice(&responses.body);
        }
        if request.body_len > 0 {
            self.phase = Phase::Body(request.body_len);
        }
        if request.keep_alive {
            Verdict::KeepOpen
        } else {
            Verdict::Close
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(body: &[u8]) -> Http {
        Http::new(Arc::new(HttpResponses::new(body)))
    }

    fn ok(body: &str, close: bool) -> String {
        format!(
            "HTTP/1.1 200 OK\r\nServer: hoststack-userstack\r\nContent-Type: text/plain\r\n\
             Content-Length: {}\r\n{}\r\n{body}",
            body.len(),
            if close { "Connection: close\r\n" } else { "" }
        )
    }

    const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n";

    #[test]
    fn answers_get_with_the_body_and_its_exact_length_and_keeps_alive() {
        let mut http = session(b"hello\n");
        let mut out = Vec::new();
        assert_eq!(http.on_input(GET, &mut out), Verdict::KeepOpen);
        assert_eq!(String::from_utf8(out).unwrap(), ok("hello\n", false));
    }

    #[test]
    fn pipelined_requests_split_anywhere_get_one_response_each() {
        let stream = [GET, b"HEAD /x HTTP/1.1\r\nHost: x\r\n\r\n", GET].concat();
        let expected = [
            ok("hi", false),
            ok("", false).replace("Length: 0", "Length: 2"),
            ok("hi", false),
        ]
        .concat();
        for split in 0..stream.len() {
            let mut http = session(b"hi");
            let mut out = Vec::new();
            assert_eq!(http.on_input(&stream[..split], &mut out), Verdict::KeepOpen);
            assert_eq!(http.on_input(&stream[split..], &mut out), Verdict::KeepOpen);
            assert_eq!(
                String::from_utf8(out).unwrap(),
                expected,
                "split at {split}"
            );
        }
    }

    #[test]
    fn connection_close_and_http10_close_after_the_response() {
        for request in [
            &b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"[..],
            b"GET / HTTP/1.0\r\n\r\n",
        ] {
            let mut http = session(b"b");
            let mut out = Vec::new();
            assert_eq!(http.on_input(request, &mut out), Verdict::Close);
            assert_eq!(String::from_utf8(out).unwrap(), ok("b", true));
        }
        let mut http = session(b"b");
        let mut out = Vec::new();
        let request = b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n";
        assert_eq!(http.on_input(request, &mut out), Verdict::KeepOpen);
    }

    #[test]
    fn a_request_body_is_skipped() {
        let mut http = session(b"b");
        let mut out = Vec::new();
        let stream = [
            &b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nGET /"[..],
            GET,
        ]
        .concat();
        assert_eq!(http.on_input(&stream, &mut out), Verdict::KeepOpen);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            [ok("b", false), ok("b", false)].concat()
        );
    }

    #[test]
    fn malformed_requests_get_400_and_close() {
        let bad_request =
            "HTTP/1.1 400 Bad Request\r\nServer: hoststack-userstack\r\nContent-Length: 0\r\n\
             Connection: close\r\n\r\n";
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(MAX_HEAD));
        for request in [
            &b"GARBAGE\r\n\r\n"[..],
            b"GET / HTTP/2.0\r\nHost: x\r\n\r\n",
            b"GET / HTTP/1.1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost x\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n",
            b"G(T / HTTP/1.1\r\nHost: x\r\n\r\n",
            long.as_bytes(),
        ] {
            let mut http = session(b"b");
            let mut out = Vec::new();
            assert_eq!(http.on_input(request, &mut out), Verdict::Close);
            assert_eq!(String::from_utf8(out).unwrap(), bad_request, "{request:?}");
            // Nothing after the 400 is answered.
            let mut more = Vec::new();
            assert_eq!(http.on_input(GET, &mut more), Verdict::Close);
            assert!(more.is_empty());
        }
    }

    #[test]
    fn other_methods_get_405() {
        let mut http = session(b"b");
        let mut out = Vec::new();
        let request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(http.on_input(request, &mut out), Verdict::Close);
        assert!(out.starts_with(b"HTTP/1.1 405 Method Not Allowed\r\n"));
    }

    #[test]
    fn a_partial_request_at_end_of_stream_gets_400() {
        let mut http = session(b"b");
        let mut out = Vec::new();
        assert_eq!(http.on_input(b"GET / HT", &mut out), Verdict::KeepOpen);
        assert_eq!(http.on_end(&mut out), Verdict::Close);
        assert!(out.starts_with(b"HTTP/1.1 400 Bad Request\r\n"));
        let mut idle = session(b"b");
        let mut none = Vec::new();
        assert_eq!(idle.on_end(&mut none), Verdict::Close);
        assert!(none.is_empty());
    }
}
