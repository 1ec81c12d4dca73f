//! What a runtime steers flows by: the NIC's own RSS key and table (the agent reads them
//! through ethtool netlink and passes them in the config's `rss`), or else a configured key
//! ([`userstack::rss::MICROSOFT_KEY`]) spread over the shards, which the DPDK backend programs
//! into the device. Shard *i* serves queue *i*.

use hoststack_runner_api::SteeringSource;
use userstack::rss::RssTable;

/// The table a runtime steers by, and where it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Steering {
    /// Where it came from (reported in the stats).
    pub source: SteeringSource,
    /// The key and indirection table.
    pub table: RssTable,
}
