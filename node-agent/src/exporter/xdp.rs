//! The drop counters of hoststack's XDP blocklist programs, read on each scrape from the per-CPU
//! `drops` map pinned for each interface under the bpffs root (`<root>/<IF>/drops`) and summed
//! over CPUs.
//!
//! - `hoststack_xdp_dropped_packets_total{interface, program}`
//! - `hoststack_xdp_dropped_bytes_total{interface, program}`
//!
//! An interface appears while its blocklist maps are pinned; a map that cannot be read is left
//! out of that scrape (logged at debug level).

use std::path::{Path, PathBuf};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use crate::host::bpf::{counted_interfaces, objects, Pins, Program};

/// Reads the pinned drop counters under a bpffs root.
#[derive(Debug)]
pub struct XdpCollector {
    root: PathBuf,
}

impl XdpCollector {
    /// A collector of the counters pinned under `bpffs_root`.
    pub fn new(bpffs_root: &Path) -> Self {
        XdpCollector {
            root: bpffs_root.to_path_buf(),
        }
    }

    /// The counters of every interface whose counters could be read.
    fn read(&self) -> Vec<Drops> {
        counted_interfaces(&self.root)
            .into_iter()
            .filter_map(|iface| match objects::drops(&Pins::new(&self.root, &iface)) {
                Ok((packets, bytes)) => Some(Drops {
                    interface: iface,
                    packets,
                    bytes,
                }),
                Err(e) => {
                    tracing::debug!(interface = %iface, error = %e, "reading XDP drop counters");
                    None
                }
            })
            .collect()
    }
}

/// One interface's drop counters, summed over CPUs.
struct Drops {
    interface: String,
    packets: u64,
    bytes: u64,
}

/// A metric family: name, help, and the counter it reports.
type Family = (&'static str, &'static str, fn(&Drops) -> u64);

impl Collector for XdpCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.read();
        if counts.is_empty() {
            return Ok(());
        }
        let program = Program::Blocklist.name();
        let families: [Family; 2] = [
            (
                "xdp_dropped_packets",
                "Packets dropped by hoststack's XDP blocklist program, summed over CPUs",
                |c| c.packets,
            ),
            (
                "xdp_dropped_bytes",
                "Bytes of the packets dropped by hoststack's XDP blocklist program, summed over \
                 CPUs",
                |c| c.bytes,
            ),
        ];
        for (name, help, value) in families {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for c in &counts {
                let labels = [("interface", c.interface.as_str()), ("program", program)];
                family
                    .encode_family(&labels)?
                    .encode_counter::<NoLabelSet, _, u64>(&value(c), None)?;
            }
        }
        Ok(())
    }
}
