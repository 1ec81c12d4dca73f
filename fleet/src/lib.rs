//! hoststack-fleet: many real node agents in one process, for the lab's scale runs
//! (`hoststack-lab scale`, docs/operator.md "Scale").
//!
//! Each agent is hoststack-agent's own code ([`hoststack_agent::controller::NodeAgent`]: its
//! watch loop, reconciler, transactions, journal, heartbeat Lease and post-apply probes) with
//! a node name of its own and a host of its own ([`host::FleetHost`], a directory tree), not a
//! stand-in that writes statuses. The agents share HTTP/2 connections ([`clients`]) and one
//! identity (the fleet's kubeconfig): the per-node identities and the write guard of a real
//! pool (docs/security.md) are not part of a scale run.
//!
//! # Layers, leaves first
//! 1. [`host`]: a node's host tree and its TCP counters.
//! 2. [`clients`]: the shared HTTP/2 clients.
//! 3. [`fleet`]: the agents, their hosts' traffic, and the shutdown.

#![deny(missing_docs)]

pub mod clients;
pub mod fleet;
pub mod host;
