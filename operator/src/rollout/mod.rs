//! Staged rollouts: the pure planner, the strategy it is given, the rollout's memory in the
//! tuning's status, each node's instruction, the analysis gates, where the Prometheus gate may
//! send its queries, and the revision history.

pub mod analysis;
pub mod gate;
pub mod history;
pub mod nodes;
pub mod planner;
pub mod progress;
pub mod prometheus;
pub mod prometheus_endpoints;
pub mod strategy;
