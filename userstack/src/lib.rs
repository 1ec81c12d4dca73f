//! userstack: hoststack's embedded user-space TCP/IP stack.
//!
//! Layers, bottom up: [`wire`] (packet formats), [`tcp`] (one connection's sans-IO state
//! machine), [`stack`] (a per-core instance with flow table, listeners, ARP and timers),
//! [`rss`] (the NIC's Toeplitz hash, to predict a flow's queue), [`device`] (batched frame I/O: memory, AF_XDP, TAP), [`runtime`] (shards pinned to
//! cores on real packets, with services) and [`sim`] (a deterministic discrete-event network
//! to judge it). The caller owns time ([`time::Instant`]) and I/O.

#![warn(missing_docs)]

pub mod counters;
pub mod device;
pub mod rss;
pub mod runtime;
pub mod sim;
pub mod stack;
pub mod tcp;
pub mod time;
pub mod wire;
