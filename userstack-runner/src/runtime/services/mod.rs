//! The services a shard serves on its listeners, and the bulk sender it runs on the
//! connections it opens itself, each a pure state machine over one connection's byte stream:
//! bytes in, bytes out, and whether to close. [`Session`] lends them the stack's rings in
//! place (no copy into or out of the application's own buffers): input is read where it lies
//! in the receive ring, and echo and bulk write straight into the send ring; http appends its
//! responses to an output buffer the shard sends from.

pub mod bulk;
pub mod discard;
pub mod echo;
pub mod http;

pub use bulk::Bulk;
pub use discard::Discard;
pub use echo::Echo;
pub use http::{Http, HttpResponses};

use std::sync::Arc;
use userstack::stack::{SocketHandle, Stack};

/// What a session wants after taking input.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Verdict {
    /// Keep the connection open.
    KeepOpen,
    /// Close the connection once the output so far has been sent.
    Close,
}

/// One connection's service state.
#[derive(Debug)]
pub enum Session {
    /// See [`Echo`].
    Echo(Echo),
    /// See [`Discard`].
    Discard(Discard),
    /// See [`Http`].
    Http(Http),
    /// See [`Bulk`].
    Bulk(Bulk),
}

/// What a listener serves: the kind and anything shared by its sessions.
#[derive(Clone, Debug)]
pub enum ServiceSpec {
    /// Echo every byte back.
    Echo,
    /// Read and drop every byte.
    Discard,
    /// HTTP/1.1 with a static body.
    Http(Arc<HttpResponses>),
}

impl ServiceSpec {
    /// A fresh session for a new connection.
    pub fn session(&self) -> Session {
        match self {
            ServiceSpec::Echo => Session::Echo(Echo),
            ServiceSpec::Discard => Session::Discard(Discard),
            ServiceSpec::Http(responses) => Session::Http(Http::new(responses.clone())),
        }
    }
}

impl Session {
    /// Takes what the peer sent to `handle`, in place in its receive ring: echo copies it
    /// straight into the send ring (as much as fits; the rest waits), discard and bulk drop
    /// it, http parses it and appends its responses to `output`, which the caller sends as
    /// the send ring makes room (echo must not be used with pending `output`). Returns the
    /// bytes consumed (0: nothing to read, no room to echo, or no such connection) and the
    /// verdict.
    pub fn take_input(
        &mut self,
        stack: &mut Stack,
        handle: SocketHandle,
        output: &mut Vec<u8>,
    ) -> (usize, Verdict) {
        let mut verdict = Verdict::KeepOpen;
        let consumed = match self {
            Session::Echo(s) => stack
                .recv_send_with(handle, |input, space| {
                    let n = s.on_input(input, space);
                    (n, n)
                })
                .map(|(consumed, _)| consumed),
            Session::Discard(s) => stack.recv_with(handle, |input| s.on_input(input)),
            Session::Bulk(s) => stack.recv_with(handle, |input| s.on_input(input)),
            Session::Http(s) => stack.recv_with(handle, |input| {
                verdict = s.on_input(input, output);
                input.len()
            }),
        };
        (consumed.unwrap_or(0), verdict)
    }

    /// Writes output the session sends unprompted in place into `handle`'s send ring: a bulk
    /// sender fills all its room; the services send only in answer to input. Returns the
    /// bytes queued.
    pub fn refill(&mut self, stack: &mut Stack, handle: SocketHandle) -> usize {
        let Session::Bulk(s) = self else {
            return 0;
        };
        let mut queued = 0;
        // The ring lends its free space in contiguous pieces: fill until it is full.
        while let Ok(n @ 1..) = stack.send_with(handle, |space| s.fill(space)) {
            queued += n;
        }
        queued
    }

    /// The peer finished sending; appends any last reply to `output`.
    pub fn on_end(&mut self, output: &mut Vec<u8>) -> Verdict {
        match self {
            Session::Echo(_) | Session::Discard(_) | Session::Bulk(_) => Verdict::Close,
            Session::Http(s) => s.on_end(output),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, SocketAddrV4};
    use userstack::stack::StackConfig;
    use userstack::tcp::Config;
    use userstack::time::Instant;
    use userstack::wire::EthernetAddress;

    const IP_B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);

    /// A client stack connected to a server stack's port 7, the server's rings of 8 KiB.
    fn connected() -> (Stack, Stack, SocketHandle, SocketHandle) {
        let config = |mac: u8, ip| {
            let mut config = StackConfig::new(EthernetAddress([2, 0, 0, 0, 0, mac]), ip, 24);
            config.secret = u64::from(mac);
            config
        };
        let mut a = Stack::new(config(1, Ipv4Addr::new(198, 18, 0, 1)), Instant::ZERO);
        let mut b = Stack::new(config(2, IP_B), Instant::ZERO);
        let small = Config {
            send_buffer: 8192,
            recv_buffer: 8192,
            ..Config::default()
        };
        b.listen_with(7, 8, small).unwrap();
        let client = a.connect(SocketAddrV4::new(IP_B, 7)).unwrap();
        exchange(&mut a, &mut b);
        let server = b.accept(7).expect("accepted");
        (a, b, client, server)
    }

    /// Moves frames both ways until the link is quiet (no timers needed).
    fn exchange(a: &mut Stack, b: &mut Stack) {
        let (mut ab, mut ba) = (Vec::new(), Vec::new());
        for _ in 0..1000 {
            a.egress(Instant::ZERO, &mut ab);
            b.egress(Instant::ZERO, &mut ba);
            if ab.is_empty() && ba.is_empty() {
                return;
            }
            b.ingress(Instant::ZERO, &mut ab);
            a.ingress(Instant::ZERO, &mut ba);
        }
    }

    #[test]
    fn echo_sessions_reply_ring_to_ring_and_wait_for_room() {
        let (mut a, mut b, client, server) = connected();
        let mut session = ServiceSpec::Echo.session();
        let mut output = Vec::new();
        let data: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8).collect();
        let (mut sent, mut echoed) = (0, Vec::new());
        let mut buf = vec![0u8; 65536];
        for _ in 0..1000 {
            sent += a.send(client, &data[sent..]).unwrap();
            exchange(&mut a, &mut b);
            while session.take_input(&mut b, server, &mut output).0 > 0 {}
            assert!(output.is_empty(), "echo writes into the send ring directly");
            exchange(&mut a, &mut b);
            let n = a.recv(client, &mut buf).unwrap();
            echoed.extend_from_slice(&buf[..n]);
            if echoed.len() == data.len() {
                break;
            }
        }
        assert_eq!(echoed, data);
    }

    #[test]
    fn discard_and_http_sessions_read_in_place_and_bulk_fills_the_send_ring() {
        let (mut a, mut b, client, server) = connected();
        let mut output = Vec::new();
        a.send(client, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        exchange(&mut a, &mut b);
        let mut http = ServiceSpec::Http(Arc::new(HttpResponses::new(b"hi"))).session();
        assert_eq!(
            http.take_input(&mut b, server, &mut output),
            (27, Verdict::KeepOpen)
        );
        assert!(output.starts_with(b"HTTP/1.1 200 OK\r\n") && output.ends_with(b"\r\n\r\nhi"));
        assert_eq!(http.take_input(&mut b, server, &mut output).0, 0);

        a.send(client, &[1; 5000]).unwrap();
        exchange(&mut a, &mut b);
        let mut discard = ServiceSpec::Discard.session();
        let mut consumed = 0;
        loop {
            let (n, verdict) = discard.take_input(&mut b, server, &mut output);
            assert_eq!(verdict, Verdict::KeepOpen);
            if n == 0 {
                break;
            }
            consumed += n;
        }
        assert_eq!(consumed, 5000);
        assert_eq!(b.connection(server).unwrap().recv_queue(), 0);

        let mut bulk = Session::Bulk(Bulk);
        assert_eq!(bulk.refill(&mut b, server), 8192, "the whole send ring");
        assert_eq!(bulk.refill(&mut b, server), 0, "no room left");
        assert_eq!(
            discard.refill(&mut b, server),
            0,
            "services send only in answer"
        );
        exchange(&mut a, &mut b);
        assert_eq!(a.recv(client, &mut vec![0; 65536]).unwrap(), 8192);
    }
}
