//! `kubectl hoststack`: see and steer a NetworkTuning's rollout from the terminal.
//!
//! - [`render`]: the pure picture of a rollout (waves → nodes → host settings, with analysis).
//! - [`steer`]: what promote, pause, resume and abort write.
//! - [`undo`]: which recorded revision undo goes back to, and the patch that does it.
//! - [`outcome`]: whether a rollout has ended and how, for `status`'s exit code and the end of
//!   `get --watch`.
//! - [`plan`]: a tuning's selection and the per-node diff of the agents' previews, with
//!   [`preview`] asking the agents (NodeTuning `spec.preview`) and collecting their answers.
//! - [`report`]: the rollout over time from Prometheus (asked with `hoststack-promql`'s range
//!   queries), as series, markers and an SVG.
//! - [`cluster`]: the I/O with the API server; [`commands`]: each command as a thin shell.
//! - [`cli`]: the command line; [`error`]: errors and exit codes.

pub mod cli;
pub mod cluster;
pub mod commands;
pub mod error;
pub mod outcome;
pub mod plan;
pub mod preview;
pub mod render;
pub mod report;
pub mod steer;
pub mod undo;
