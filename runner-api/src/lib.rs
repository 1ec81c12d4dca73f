//! hoststack-runner-api: the contract between the agent's dataplane supervisor and the
//! user-space stack's runner (`hoststack-userstack run --config FILE --stats FILE`), written
//! once and used by both sides, the way bpfman keeps its API in a crate of its own: the
//! [`RunnerConfig`] the agent writes and the runner reads ([`config`]), and the
//! [`RunnerStats`] the runner writes and the agent reads ([`stats`]). Types only, with serde
//! and no I/O: each side reads and writes the JSON itself. The user's API is the CRD
//! (`hoststack_crds::UserspaceStack`); the agent translates it into this contract.
//!
//! How strictly each document is read follows who may write it:
//! - the config is read with `deny_unknown_fields`: the agent writes it for a runner of its
//!   own release (the binary beside it), so a field the runner does not know is a contract
//!   break, and the runner fails its setup naming the field rather than silently run without
//!   a setting (a TCP option, the NIC's RSS table) the agent asked for;
//! - the stats are read leniently: a runner outlives the agent that started it (an agent
//!   upgrade adopts the running runner), so the agent may read the stats of an earlier
//!   release and ignores fields it no longer knows. A renamed field still fails to parse,
//!   because every field the agent's report rests on is required (see [`stats`] for the few
//!   optional ones).
//!
//! The tests pin the JSON of a full config and a full stats document.

#![warn(missing_docs)]

pub mod config;
pub mod stats;

pub use config::{
    Backend, ClientConfig, ClientKind, CongestionControl, DpdkConfig, IdlePolicy, RssConfig,
    RunnerConfig, ServiceConfig, ServiceKind, TcpOptions, DEFAULT_DRAIN_TIMEOUT_MS,
};
pub use stats::{
    ChecksumOffloadStats, QueueDrops, RunState, RunnerStats, RxStamps, RxWait, ServiceStats,
    ShardStats, SteeringSource, SteeringStats, StopStats, RX_WAIT_BUCKETS,
};
