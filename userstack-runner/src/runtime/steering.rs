//! What a runtime steers flows by: the NIC's own RSS key and table (the agent reads them
//! through ethtool netlink and passes them in the config's `rss`), or else a configured key
//! ([`userstack::rss::MICROSOFT_KEY`]) spread over the shards, which the DPDK backend programs
//! into the device. Shard *i* serves queue *i*.

use userstack::rss::RssTable;

/// Where a runtime's RSS key and table come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SteeringSource {
    /// Read from the NIC (ethtool netlink, by the agent).
    Nic,
    /// The configured key spread over the shards (the NIC has no RSS to read, or the
    /// backend programs the key itself).
    Configured,
}

impl SteeringSource {
    /// The spelling in the stats file.
    pub fn as_str(self) -> &'static str {
        match self {
            SteeringSource::Nic => "nic",
            SteeringSource::Configured => "configured",
        }
    }
}

/// The table a runtime steers by, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steering {
    /// Where it came from.
    pub source: SteeringSource,
    /// The key and indirection table.
    pub table: RssTable,
}
