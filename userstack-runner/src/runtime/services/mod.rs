//! The services a shard serves on its listeners, and the bulk sender it runs on the
//! connections it opens itself, each a pure state machine over one connection's byte stream:
//! bytes in, bytes out, and whether to close. The shard moves the bytes between them and the
//! stack.

pub mod bulk;
pub mod discard;
pub mod echo;
pub mod http;

pub use bulk::Bulk;
pub use discard::Discard;
pub use echo::Echo;
pub use http::{Http, HttpResponses};

use std::sync::Arc;

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
    /// Takes `input` from the peer and appends the reply to `output`.
    pub fn on_input(&mut self, input: &[u8], output: &mut Vec<u8>) -> Verdict {
        match self {
            Session::Echo(s) => s.on_input(input, output),
            Session::Discard(s) => s.on_input(input),
            Session::Http(s) => s.on_input(input, output),
            Session::Bulk(s) => s.on_input(input),
        }
    }

    /// Queues output the session sends unprompted (a bulk sender's next chunk); the
    /// services send only in answer to input.
    pub fn refill(&mut self, output: &mut Vec<u8>) {
        if let Session::Bulk(s) = self {
            s.refill(output);
        }
    }

    /// The peer finished sending; appends any last reply to `output`.
    pub fn on_end(&mut self, output: &mut Vec<u8>) -> Verdict {
        match self {
            Session::Echo(_) | Session::Discard(_) | Session::Bulk(_) => Verdict::Close,
            Session::Http(s) => s.on_end(output),
        }
    }
}
