//! The TCP engine: one connection's sans-IO state machine and its parts.

mod assembler;
pub mod config;
pub mod congestion;
mod connection;
mod hystart;
mod rack;
mod ring_buffer;
mod rtt;
mod scoreboard;

pub use config::{Config, CongestionAlgorithm};
pub use connection::{Connection, ConnectionError, ConnectionStats, State};
pub use ring_buffer::RingBuffer;
pub use rtt::RttEstimator;
pub use scoreboard::{Scoreboard, SentSegment};

#[cfg(test)]
mod tests;
