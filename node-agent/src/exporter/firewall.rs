//! The drop counters of the agent's nftables table (`inet hoststack`), read from the kernel on
//! every scrape: one series per dropping rule, named by the rule's comment.
//!
//! - `hoststack_firewall_dropped_packets_total{table="inet/hoststack", rule}`
//! - `hoststack_firewall_dropped_bytes_total{table="inet/hoststack", rule}`
//!
//! `rule` is one of `blocked-ipv4`, `blocked-ipv6`, `syn-limit-ipv4`, `syn-limit-ipv6` (those the
//! table has). Without the table (or with a table of that name the agent did not make) both
//! families are left out, and a failed listing is logged and leaves them out too: a scrape
//! never fails for the firewall.

use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::appliers::firewall::TARGET;
use crate::host::nftables::netlink::{self, DropCounter};

/// Collects the drop counters from the kernel on each scrape.
#[derive(Debug, Default)]
pub struct FirewallCollector {
    /// Whether a failed listing was logged already (later ones go to debug).
    warned: AtomicBool,
}

impl Collector for FirewallCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        match netlink::drop_counters() {
            Ok(counters) => encode(&counters, encoder),
            Err(e) => {
                if self.warned.swap(true, Ordering::Relaxed) {
                    tracing::debug!(error = %e, "listing the nftables drop counters");
                } else {
                    tracing::warn!(error = %e, "listing the nftables drop counters failed; they are left out");
                }
                Ok(())
            }
        }
    }
}

/// A family's name, help text and the counter's field.
type FamilySpec = (&'static str, &'static str, fn(&DropCounter) -> u64);

/// Encodes `counters` as the two families; nothing at all when there are none.
pub fn encode(
    counters: &[DropCounter],
    mut encoder: DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    if counters.is_empty() {
        return Ok(());
    }
    let families: [FamilySpec; 2] = [
        (
            "firewall_dropped_packets",
            "Packets dropped by a rule of the agent's nftables table, by rule",
            |c| c.packets,
        ),
        (
            "firewall_dropped_bytes",
            "Bytes dropped by a rule of the agent's nftables table, by rule",
            |c| c.bytes,
        ),
    ];
    for (name, help, value) in families {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for c in counters {
            family
                .encode_family(&[("table", TARGET), ("rule", c.rule.as_str())])?
                .encode_counter::<NoLabelSet, _, u64>(&value(c), None)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use prometheus_client::registry::Registry;

    use super::*;

    /// A collector over fixed counters.
    #[derive(Debug)]
    struct Fixed(Vec<DropCounter>);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
            encode(&self.0, encoder)
        }
    }

    fn text(counters: Vec<DropCounter>) -> String {
        let mut registry = Registry::with_prefix("hoststack");
        registry.register_collector(Box::new(Fixed(counters)));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).unwrap();
        out
    }

    #[test]
    fn one_series_per_dropping_rule() {
        let out = text(vec![
            DropCounter {
                rule: "blocked-ipv4".into(),
                packets: 3,
                bytes: 252,
            },
            DropCounter {
                rule: "syn-limit-ipv4".into(),
                packets: 150,
                bytes: 9000,
            },
        ]);
        for line in [
            "# TYPE hoststack_firewall_dropped_packets counter",
            "hoststack_firewall_dropped_packets_total{table=\"inet/hoststack\",rule=\"blocked-ipv4\"} 3",
            "hoststack_firewall_dropped_packets_total{table=\"inet/hoststack\",rule=\"syn-limit-ipv4\"} 150",
            "hoststack_firewall_dropped_bytes_total{table=\"inet/hoststack\",rule=\"blocked-ipv4\"} 252",
            "hoststack_firewall_dropped_bytes_total{table=\"inet/hoststack\",rule=\"syn-limit-ipv4\"} 9000",
        ] {
            assert!(out.lines().any(|l| l == line), "{line}\n{out}");
        }
    }

    #[test]
    fn without_the_table_there_is_nothing() {
        assert_eq!(text(Vec::new()), "# EOF\n");
    }
}
