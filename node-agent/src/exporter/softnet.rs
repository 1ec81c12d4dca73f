//! `/proc/net/softnet_stat`: the per-CPU backlog counters of the receive path.
//!
//! One line per online CPU, columns in hex. The columns kept, by kernel:
//!
//! | column | meaning | since |
//! | --- | --- | --- |
//! | 0 | packets processed | always |
//! | 1 | packets dropped (backlog full) | always |
//! | 2 | time_squeeze: the net_rx_action budget ran out with work left | always |
//! | 9 | received_rps: RPS IPIs received | 2.6.35 |
//! | 10 | flow_limit_count | 3.11 |
//! | 11 | backlog length now (a gauge) | 5.10 |
//! | 12 | the CPU's index | 5.10 |
//!
//! Without the index column (older kernels) the line number is the CPU, which is wrong when a
//! CPU is offline (its line is skipped): that is why the kernel added the column.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::{read_into, ReadErrors};

/// One CPU's line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Cpu {
    /// The CPU's index (the column, or the line number on kernels without it).
    pub cpu: u32,
    /// Packets processed.
    pub processed: u64,
    /// Packets dropped because the backlog was full.
    pub dropped: u64,
    /// Times net_rx_action stopped with work left.
    pub time_squeeze: u64,
    /// RPS inter-processor interrupts received (column 9).
    pub received_rps: Option<u64>,
    /// Packets dropped by the flow limit (column 10).
    pub flow_limit_count: Option<u64>,
    /// Packets in the backlog now (column 11).
    pub backlog_len: Option<u64>,
}

/// Why the file was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A line with fewer than the three columns every kernel prints.
    #[error("line {line}: {columns} columns, expected at least 3")]
    TooFewColumns {
        /// 1-based line number.
        line: usize,
        /// Columns found.
        columns: usize,
    },
    /// A column that is not a hex number.
    #[error("line {line}: column {column} {value:?} is not hexadecimal")]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// 0-based column.
        column: usize,
        /// The text, lossily decoded.
        value: String,
    },
}

/// Parses softnet_stat `text` into `out` (cleared first; left empty on error). Never panics.
pub fn parse(text: &[u8], out: &mut Vec<Cpu>) -> Result<(), ParseError> {
    out.clear();
    let result = parse_into(text, out);
    if result.is_err() {
        out.clear();
    }
    result
}

fn parse_into(text: &[u8], out: &mut Vec<Cpu>) -> Result<(), ParseError> {
    for (i, line) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = i + 1;
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let mut cpu = Cpu {
            cpu: u32::try_from(out.len()).unwrap_or(u32::MAX),
            ..Cpu::default()
        };
        let mut columns = 0;
        for (column, raw) in line
            .split(|b| b.is_ascii_whitespace())
            .filter(|t| !t.is_empty())
            .enumerate()
        {
            columns += 1;
            let value = hex(raw).ok_or_else(|| ParseError::BadValue {
                line: line_no,
                column,
                value: String::from_utf8_lossy(raw).into_owned(),
            })?;
            match column {
                0 => cpu.processed = value,
                1 => cpu.dropped = value,
                2 => cpu.time_squeeze = value,
                9 => cpu.received_rps = Some(value),
                10 => cpu.flow_limit_count = Some(value),
                11 => cpu.backlog_len = Some(value),
                12 => cpu.cpu = u32::try_from(value).unwrap_or(u32::MAX),
                _ => {}
            }
        }
        if columns < 3 {
            return Err(ParseError::TooFewColumns {
                line: line_no,
                columns,
            });
        }
        out.push(cpu);
    }
    Ok(())
}

fn hex(raw: &[u8]) -> Option<u64> {
    if raw.len() > 16 {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &b| {
        let digit = (b as char).to_digit(16)?;
        Some(acc << 4 | u64::from(digit))
    })
}

/// The collector of `<proc-root>/net/softnet_stat`.
#[derive(Debug)]
pub struct SoftnetCollector {
    path: PathBuf,
    errors: ReadErrors,
    scratch: Mutex<(Vec<u8>, Vec<Cpu>)>,
}

impl SoftnetCollector {
    /// A collector of the file under `proc_root`, counting failures in `errors`.
    pub fn new(proc_root: &Path, errors: ReadErrors) -> Self {
        SoftnetCollector {
            path: proc_root.join("net/softnet_stat"),
            errors,
            scratch: Mutex::default(),
        }
    }
}

type Column = fn(&Cpu) -> Option<u64>;

/// The exported families: name, help, type, column.
const FAMILIES: [(&str, &str, MetricType, Column); 6] = [
    (
        "softnet_processed",
        "Packets processed by the CPU's softirq (softnet_stat column 0)",
        MetricType::Counter,
        |c| Some(c.processed),
    ),
    (
        "softnet_dropped",
        "Packets dropped because the CPU's backlog was full (column 1)",
        MetricType::Counter,
        |c| Some(c.dropped),
    ),
    (
        "softnet_time_squeeze",
        "Times net_rx_action ran out of budget or time with work left (column 2)",
        MetricType::Counter,
        |c| Some(c.time_squeeze),
    ),
    (
        "softnet_received_rps",
        "RPS inter-processor interrupts the CPU received (column 9)",
        MetricType::Counter,
        |c| c.received_rps,
    ),
    (
        "softnet_flow_limit_count",
        "Packets dropped by the flow limit (column 10)",
        MetricType::Counter,
        |c| c.flow_limit_count,
    ),
    (
        "softnet_backlog_len",
        "Packets in the CPU's backlog queues now (column 11, kernel 5.10 and later)",
        MetricType::Gauge,
        |c| c.backlog_len,
    ),
];

impl Collector for SoftnetCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let (text, cpus) = &mut *scratch;
        let result = read_into(&self.path, text)
            .map_err(|e| e.to_string())
            .and_then(|()| parse(text, cpus).map_err(|e| e.to_string()));
        if let Err(e) = result {
            cpus.clear();
            self.errors.failed("softnet_stat", &self.path, &e);
            return Ok(());
        }
        for (name, help, kind, column) in FAMILIES {
            if !cpus.iter().any(|c| column(c).is_some()) {
                continue;
            }
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for cpu in cpus.iter() {
                let Some(value) = column(cpu) else { continue };
                let labels = [("cpu", cpu.cpu)];
                let mut sample = family.encode_family(&labels)?;
                match kind {
                    MetricType::Counter => {
                        sample.encode_counter::<NoLabelSet, _, u64>(&value, None)?
                    }
                    _ => sample.encode_gauge(&value)?,
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_by_kernel() {
        let mut out = vec![];
        // 4.19: 11 columns, no index: the line number is the CPU.
        parse(b"0000000a 00000001 00000002 00000000 00000000 00000000 00000000 00000000 00000000 00000003 00000004\n00000010 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000\n", &mut out).unwrap();
        assert_eq!(out.len(), 2);
        assert_eq!(
            out[0],
            Cpu {
                cpu: 0,
                processed: 10,
                dropped: 1,
                time_squeeze: 2,
                received_rps: Some(3),
                flow_limit_count: Some(4),
                backlog_len: None,
            }
        );
        assert_eq!((out[1].cpu, out[1].processed), (1, 16));
        // 6.x with CPU 1 offline: the index column names CPU 2.
        parse(b"000000ff 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000000 00000005 00000002 00000003 00000002\n", &mut out).unwrap();
        assert_eq!(
            (out[0].cpu, out[0].processed, out[0].backlog_len),
            (2, 255, Some(5))
        );
    }

    #[test]
    fn malformed_is_an_error() {
        let mut out = vec![];
        assert_eq!(
            parse(b"00000001 00000002\n", &mut out),
            Err(ParseError::TooFewColumns {
                line: 1,
                columns: 2
            })
        );
        assert!(matches!(
            parse(b"00000001 0000000g 00000000\n", &mut out),
            Err(ParseError::BadValue { column: 1, .. })
        ));
        assert!(matches!(
            parse(b"11111111111111111111 0 0\n", &mut out),
            Err(ParseError::BadValue { column: 0, .. })
        ));
        assert!(out.is_empty());
    }
}
