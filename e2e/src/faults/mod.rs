//! The fault harness's pure core (issue 18): what a fault campaign records and what it checks.
//!
//! A campaign runs rollouts over the lab's nodes while it injects faults at points a seeded
//! [`schedule::Schedule`] chooses, records every assignment the operator makes, every host
//! write and status report of every agent, every journal original and the hosts at quiescent
//! points as one [`history::History`], and then checks the invariants of
//! [`invariants::check`] over the whole history, not only the end state. A failing seed is
//! printed, replayed by passing the same seed, and committed as a regression case.

pub mod history;
pub mod invariants;
pub mod schedule;
