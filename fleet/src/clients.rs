//! The fleet's clients to the API server: one HTTP/2 connection carries many agents' watches
//! and writes, as a kubelet's one connection carries its node's. kube's own client speaks
//! HTTP/1.1 only, one connection per request in flight (and a watch is always in flight), so a
//! fleet of 5,000 agents would hold 5,000 connections or more.
//!
//! The API server caps the streams of one connection (`--http2-max-streams-per-connection`,
//! 1000 in the scale lab); a stream past the cap waits for one to end, and a watch never ends.
//! [`Clients`] therefore gives each connection at most `agents_per_connection` agents, well
//! under the cap, so that their writes always find a free stream.

use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use kube::client::{Body, ConfigExt};
use kube::Client;
use tower::{BoxError, ServiceBuilder};

/// A client whose requests all travel over one HTTP/2 connection to the API server.
pub fn http2_client(config: &kube::Config) -> kube::Result<Client> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http);
    let hyper: HyperClient<_, Body> = HyperClient::builder(TokioExecutor::new())
        .http2_only(true)
        .build(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace.clone()))
}

/// The fleet's clients, handed out so that no connection carries more than
/// `agents_per_connection` agents.
pub struct Clients {
    config: kube::Config,
    agents_per_connection: usize,
    open: Vec<Client>,
    handed_out: usize,
}

impl Clients {
    /// Clients made from `config`, `agents_per_connection` agents each (at least one).
    pub fn new(config: kube::Config, agents_per_connection: usize) -> Clients {
        Clients {
            config,
            agents_per_connection: agents_per_connection.max(1),
            open: Vec::new(),
            handed_out: 0,
        }
    }

    /// The client of the next agent: the newest connection's, or a new connection when that
    /// one is full.
    pub fn next_agent(&mut self) -> kube::Result<Client> {
        if self.handed_out.is_multiple_of(self.agents_per_connection) {
            self.open.push(http2_client(&self.config)?);
        }
        self.handed_out += 1;
        Ok(self
            .open
            .last()
            .expect("a connection was just opened")
            .clone())
    }

    /// How many connections the clients handed out so far use.
    pub fn connections(&self) -> usize {
        self.open.len()
    }
}
