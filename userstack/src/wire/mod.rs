//! Packet formats: zero-copy views (`Packet`/`Frame`) with one accessor per field, plus plain
//! `Repr` structs with `parse` and `emit`. Parsing never panics; malformed input is rejected
//! with a [`ParseError`].

pub mod arp;
pub mod checksum;
mod error;
pub mod ethernet;
pub mod icmp;
pub mod ipv4;
pub mod offload;
pub mod tcp;
pub mod template;

pub use arp::{ArpOperation, ArpRepr};
pub use error::ParseError;
pub use ethernet::{ethertype, EthernetAddress, EthernetRepr};
pub use icmp::IcmpRepr;
pub use ipv4::Ipv4Repr;
pub use tcp::{SackBlocks, SeqNumber, TcpFlags, TcpOptions, TcpRepr};
