//! The client for synchronous callers (the e2e lab): the async [`Client`](crate::Client)'s
//! instant query run on a current-thread runtime that the blocking client makes once and keeps,
//! so that a loop of queries does not start a runtime per call. Not for use inside an async
//! runtime.

use std::time::Duration;

use crate::answer::Data;
use crate::endpoint::Endpoint;
use crate::error::Result;

/// A blocking client of one Prometheus server.
#[derive(Debug)]
pub struct Client {
    runtime: tokio::runtime::Runtime,
    inner: crate::Client,
}

impl Client {
    /// A client of the server at `endpoint`, with the default timeout and size limit; fails
    /// only when its runtime cannot be made.
    pub fn new(endpoint: Endpoint) -> std::io::Result<Client> {
        Client::wrap(crate::Client::new(endpoint))
    }

    /// A blocking client that runs `inner`'s queries (one made with access settings, say);
    /// fails only when its runtime cannot be made.
    pub fn wrap(inner: crate::Client) -> std::io::Result<Client> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok(Client { runtime, inner })
    }

    /// The same client with another timeout for each query.
    pub fn with_timeout(self, timeout: Duration) -> Client {
        Client {
            inner: self.inner.with_timeout(timeout),
            ..self
        }
    }

    /// Evaluates `expr` at `time` (Unix seconds; the server's now when `None`).
    pub fn query(&self, expr: &str, time: Option<f64>) -> Result<Data> {
        self.runtime.block_on(self.inner.query(expr, time))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_closed_port_is_unreachable_from_blocking_code_too() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint =
            Endpoint::parse(&format!("http://{}", listener.local_addr().unwrap())).unwrap();
        drop(listener);
        let client = Client::new(endpoint).unwrap();
        for _ in 0..2 {
            let e = client.query("up", None).unwrap_err();
            assert!(matches!(e, crate::Error::Unreachable { .. }), "{e:?}");
        }
    }
}
