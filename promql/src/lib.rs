//! A small client for Prometheus' HTTP API: instant queries (`/api/v1/query`) and range queries
//! (`/api/v1/query_range`) over HTTP or HTTPS, with credentials and custom headers, a timeout
//! and a response size limit, and the answer decoded into typed vectors, scalars and matrices.
//!
//! - [`Endpoint`]: a server's base URL (`http[s]://host[:port][/prefix]`), checked once.
//! - [`Access`]: a CA bundle, [`Credentials`] and headers for servers that ask for them.
//! - [`Client`]: the async queries, on hyper; [`blocking::Client`] runs instant queries for
//!   synchronous callers on a runtime of its own, made once.
//! - [`Data`], [`Sample`], [`Series`]: what an answer holds; [`decode`] reads one.
//! - [`Error`]: what went wrong, each variant saying where (the address, the connection, the
//!   HTTP status, Prometheus' own error, or an answer of another shape than asked).
//!
//! Used by the operator's rollout gate, `kubectl hoststack report` and the e2e lab.

pub mod access;
pub mod answer;
pub mod blocking;
pub mod client;
pub mod endpoint;
pub mod error;

pub use access::{Access, Credentials};
pub use answer::{decode, Data, Sample, Series};
pub use client::{Client, Range, DEFAULT_TIMEOUT};
pub use endpoint::Endpoint;
pub use error::{Error, Result};
