//! userstack-runner: the user-space TCP engine (crate `userstack`) on real packets, as the
//! process `hoststack-userstack` that the agent's dataplane supervisor starts and watches.
//!
//! [`device`] moves frames in batches (AF_XDP with its redirect program, TAP, an in-memory
//! link for tests, DPDK with the cargo feature `dpdk`); [`runtime`] runs one pinned shard per
//! dedicated core on those devices, with the services, the graceful stop and the stats. The
//! config it reads and the stats it writes are the agent's contract, crate
//! `hoststack-runner-api`.

#![warn(missing_docs)]

pub mod device;
pub mod runtime;
