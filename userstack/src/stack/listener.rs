//! A listening port: its SYN queue and accept queue, both bounded.

use super::SocketHandle;
use crate::tcp::Config;
use std::collections::VecDeque;

/// A passive-open endpoint (RFC 9293 LISTEN).
#[derive(Debug)]
pub struct Listener {
    /// Connections created here inherit this configuration.
    pub config: Config,
    /// Connections in SYN-RECEIVED born here (Linux's request queue).
    pub syn_queue_len: usize,
    /// Bound of the SYN queue (`net.ipv4.tcp_max_syn_backlog`).
    pub syn_queue_limit: usize,
    /// Established connections not yet accepted.
    pub accept_queue: VecDeque<SocketHandle>,
    /// Bound of the accept queue (the `listen` backlog, capped by `net.core.somaxconn`).
    pub backlog: usize,
}

impl Listener {
    /// A listener with the given bounds.
    pub fn new(config: Config, backlog: usize, syn_queue_limit: usize) -> Listener {
        Listener {
            config,
            syn_queue_len: 0,
            syn_queue_limit,
            accept_queue: VecDeque::new(),
            backlog,
        }
    }

    /// Whether the accept queue is full (Linux `sk_acceptq_is_full`).
    pub fn accept_queue_full(&self) -> bool {
        self.accept_queue.len() >= self.backlog
    }

    /// Whether the SYN queue is full.
    pub fn syn_queue_full(&self) -> bool {
        self.syn_queue_len >= self.syn_queue_limit
    }
}
