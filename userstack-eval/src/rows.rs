//! The evaluation's rows: one path (a 100 Mbit/s bottleneck, 20 ms of base RTT, a 250-packet
//! drop-tail queue) and the flows and impairments each row puts on it. The simulator and the
//! real link run the same rows.

/// The bottleneck's rate.
pub const BOTTLENECK_MBPS: u32 = 100;
/// The base round-trip time.
pub const BASE_RTT_MS: u32 = 20;
/// The bottleneck queue, in packets.
pub const QUEUE_PACKETS: u32 = 250;
/// The first receiving port; flow *i* of a row with per-flow RTTs goes to port `FIRST_PORT + i`.
pub const FIRST_PORT: u16 = 5001;

/// One row of the evaluation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Row {
    /// The row's name in the tables.
    pub label: &'static str,
    /// Concurrent bulk flows.
    pub flows: usize,
    /// Random loss on the data direction, as a probability.
    pub loss: f64,
    /// SACK (and D-SACK) on both ends.
    pub sack: bool,
    /// Spread of the extra per-packet delay on the data direction, in milliseconds: each packet
    /// waits a uniform extra delay in `[0, jitter)`, which reorders packets.
    pub jitter_ms: f64,
    /// Per-flow round-trip times in milliseconds (flow *i* takes entry *i*); empty: every flow
    /// has [`BASE_RTT_MS`].
    pub rtts_ms: &'static [u32],
}

impl Row {
    /// Flow `i`'s round-trip time in milliseconds.
    pub fn rtt_ms(&self, i: usize) -> u32 {
        self.rtts_ms.get(i).copied().unwrap_or(BASE_RTT_MS)
    }

    /// The receiving port of flow `i`: one port per distinct RTT, so that the path can tell
    /// the flows apart by port; [`FIRST_PORT`] for every flow otherwise.
    pub fn port(&self, i: usize) -> u16 {
        if self.rtts_ms.is_empty() {
            FIRST_PORT
        } else {
            FIRST_PORT + i as u16
        }
    }

    /// The distinct receiving ports, each with the round-trip time of its flows.
    pub fn ports(&self) -> Vec<(u16, u32)> {
        let mut ports: Vec<(u16, u32)> = (0..self.flows)
            .map(|i| (self.port(i), self.rtt_ms(i)))
            .collect();
        ports.dedup();
        ports
    }
}

const fn row(
    label: &'static str,
    flows: usize,
    loss: f64,
    sack: bool,
    jitter_ms: f64,
    rtts_ms: &'static [u32],
) -> Row {
    Row {
        label,
        flows,
        loss,
        sack,
        jitter_ms,
        rtts_ms,
    }
}

/// Every row, in the tables' order.
pub const ROWS: [Row; 10] = [
    row("1 flow", 1, 0.0, true, 0.0, &[]),
    row("8 flows", 8, 0.0, true, 0.0, &[]),
    row("16 flows", 16, 0.0, true, 0.0, &[]),
    row("1 flow, 1 % loss", 1, 0.01, true, 0.0, &[]),
    row("8 flows, 1 % loss", 8, 0.01, true, 0.0, &[]),
    row("1 flow, 5 % loss", 1, 0.05, true, 0.0, &[]),
    row("8 flows, 5 % loss", 8, 0.05, true, 0.0, &[]),
    row("1 flow, 5 % loss, SACK off", 1, 0.05, false, 0.0, &[]),
    row("4 flows, 1 ms jitter", 4, 0.0, true, 1.0, &[]),
    row(
        "4 flows, RTT 20/40/60/80 ms",
        4,
        0.0,
        true,
        0.0,
        &[20, 40, 60, 80],
    ),
];

/// The row labelled `label`.
pub fn by_label(label: &str) -> Option<&'static Row> {
    ROWS.iter().find(|r| r.label == label)
}

/// The rows whose labels `text` lists, separated by `;`.
pub fn parse_list(text: &str) -> Result<Vec<&'static Row>, String> {
    text.split(';')
        .map(|label| by_label(label.trim()).ok_or_else(|| format!("no row is labelled {label:?}")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flows_of_different_rtts_get_a_port_each() {
        let row = by_label("4 flows, RTT 20/40/60/80 ms").unwrap();
        assert_eq!(
            row.ports(),
            vec![(5001, 20), (5002, 40), (5003, 60), (5004, 80)]
        );
        let row = by_label("16 flows").unwrap();
        assert_eq!(row.ports(), vec![(5001, 20)]);
        assert_eq!(row.rtt_ms(15), 20);
    }

    #[test]
    fn lists_name_rows_by_label() {
        let rows = parse_list("1 flow; 16 flows").unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[1].flows, 16);
        assert!(parse_list("1 flow;2 flows")
            .unwrap_err()
            .contains("\"2 flows\""));
    }

    #[test]
    fn labels_are_unique() {
        for (i, a) in ROWS.iter().enumerate() {
            assert!(
                ROWS[i + 1..].iter().all(|b| b.label != a.label),
                "{}",
                a.label
            );
        }
    }
}
