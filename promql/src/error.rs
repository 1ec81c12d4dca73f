//! The client's one error type: each variant names the stage that failed, and its message says
//! what went wrong there.

use std::time::Duration;

use hyper::StatusCode;

/// Everything a query can run into.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The server's URL is not one the client can use.
    #[error("bad Prometheus address {address:?}: {reason}")]
    Address {
        /// The URL as given.
        address: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// The access settings (CA bundle, credentials, headers) cannot be used.
    #[error("Prometheus access settings: {0}")]
    Access(String),
    /// The TLS handshake failed (an untrusted or mismatched certificate, or a server that does
    /// not speak TLS).
    #[error("TLS with Prometheus at {url} failed: {reason}")]
    Tls {
        /// The server's base URL.
        url: String,
        /// What rustls reported.
        reason: String,
    },
    /// No connection, or it broke before an answer came.
    #[error("Prometheus at {url} unreachable: {reason}")]
    Unreachable {
        /// The server's base URL.
        url: String,
        /// The innermost cause (e.g. `Connection refused (os error 111)`).
        reason: String,
    },
    /// No whole answer within the client's timeout.
    #[error("Prometheus at {url} did not answer within {after:?}")]
    Timeout {
        /// The server's base URL.
        url: String,
        /// The timeout.
        after: Duration,
    },
    /// The answer's body could not be read whole (or was over the size limit).
    #[error("reading Prometheus' answer: {0}")]
    Read(String),
    /// An answer with an HTTP error status that is not Prometheus' own error report.
    #[error("Prometheus answered {status}: {source}")]
    Status {
        /// The HTTP status.
        status: StatusCode,
        /// Why its body could not be used.
        source: Box<Error>,
    },
    /// The body is not a Prometheus API answer (not JSON, or not of its shape).
    #[error("not a Prometheus answer: {0}")]
    NotPrometheus(String),
    /// Prometheus refused the query (`"status": "error"`), e.g. a PromQL parse error.
    #[error("{error_type}: {message}")]
    Refused {
        /// Its `errorType` (e.g. `bad_data`).
        error_type: String,
        /// Its `error` message.
        message: String,
    },
    /// A Prometheus answer, but not of the shape the caller asked for or can use.
    #[error("{0}")]
    Unexpected(String),
}

/// Result with the client's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
