//! userstack: hoststack's embedded user-space TCP/IP engine, OS-free.
//!
//! Layers, bottom up: [`wire`] (packet formats), [`tcp`] (one connection's sans-IO state
//! machine), [`stack`] (a per-core instance with flow table, listeners, ARP and timers),
//! [`counters`] (named as in /proc/net/snmp and /proc/net/netstat) and [`rss`] (the NIC's
//! Toeplitz hash, to predict a flow's queue). The caller owns time ([`time::Instant`]) and
//! I/O: the engine reads no clock, opens no device and needs no operating system. Packet I/O
//! on real devices is the runner's (crate `userstack-runner`), the network it is judged in
//! the simulator's (crate `userstack-sim`).

#![warn(missing_docs)]

pub mod counters;
pub mod rss;
pub mod stack;
pub mod tcp;
pub mod time;
pub mod wire;
