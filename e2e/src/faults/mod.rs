//! The fault harness (issue 18): seeded faults injected into a real lab while rollouts run, and
//! the invariants checked over each run's whole history, not only its end state.
//!
//! A campaign ([`campaign`]) runs a rollout script over the lab's nodes while it injects the
//! faults a seeded [`schedule::Schedule`] chooses ([`inject`]: real kills, restarts, cut-offs).
//! It reads every assignment the operator made, every host write, report and journal original
//! of every agent, and the hosts at quiet points as one [`history::History`] ([`record`]: from
//! the API server's audit log and the agents' write logs, never from what the campaign believes
//! it did), and checks the invariants of [`invariants::check`] over it. A failing seed is
//! printed, replayed by passing the same seed (`hoststack-lab faults --seed N`), and committed
//! as a regression case (e2e/tests/faults.rs). The [`soak`] runs the script for an hour (five
//! minutes in CI) and samples the operator's and agents' memory and descriptors.

pub mod aim;
pub mod campaign;
pub mod history;
pub mod inject;
pub mod invariants;
pub mod record;
pub mod schedule;
pub mod soak;
