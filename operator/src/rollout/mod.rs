//! Staged rollouts: the pure planner now; the controller wiring, revision history and analysis
//! gates build on it.

pub mod planner;
