//! `/proc/net/netstat` and `/proc/net/snmp`: every field of every section, under the name the
//! kernel prints.
//!
//! Both files are pairs of lines, a header naming the fields of a section and a line of values:
//!
//! ```text
//! TcpExt: SyncookiesSent SyncookiesRecv ... TCPSackRecovery ... TCPDSACKRecv ...
//! TcpExt: 0 0 ... 12 ... 3 ...
//! ```
//!
//! Every section present (`TcpExt`, `IpExt`, `MPTcpExt`, `Ip`, `Icmp`, `IcmpMsg`, `Tcp`, `Udp`,
//! `UdpLite`, and whatever a later kernel adds) is exported: counters in the family
//! `hoststack_netstat_total{stack="kernel", proto, field}`, and the few fields that are not
//! counters (see [`is_gauge`]) in `hoststack_netstat_value{stack="kernel", proto, field}`. Field
//! and section names are taken from the file, never from a list. The files are read and parsed
//! on every scrape into buffers that are kept between scrapes.
//!
//! The user-space stack's counters, from its runner's stats file, join the same families with
//! `stack="userspace"` and the same section and field names, so one query compares both stacks.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

use super::{read_into, ReadErrors};

/// The fields of `/proc/net/snmp` that are gauges, not counters: `Tcp` RtoAlgorithm, RtoMin,
/// RtoMax and MaxConn are constants of the kernel (MaxConn is -1), CurrEstab is the number of
/// connections now established, and `Ip` Forwarding and DefaultTTL are settings.
pub const GAUGE_FIELDS: [(&str, &str); 7] = [
    ("Tcp", "RtoAlgorithm"),
    ("Tcp", "RtoMin"),
    ("Tcp", "RtoMax"),
    ("Tcp", "MaxConn"),
    ("Tcp", "CurrEstab"),
    ("Ip", "Forwarding"),
    ("Ip", "DefaultTTL"),
];

/// Whether `proto`/`field` is a gauge (see [`GAUGE_FIELDS`]); every other field is a counter.
pub fn is_gauge(proto: &str, field: &str) -> bool {
    GAUGE_FIELDS.iter().any(|&(p, f)| p == proto && f == field)
}

/// One field of a parsed file: byte ranges of its section and name in the text, and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    proto: Range<usize>,
    field: Range<usize>,
    /// The value as printed (the kernel prints counters unsigned, MaxConn as -1).
    pub value: Value,
}

/// A field's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value {
    /// A counter (every field but [`GAUGE_FIELDS`]).
    Counter(u64),
    /// A gauge (one of [`GAUGE_FIELDS`]).
    Gauge(i64),
}

impl Entry {
    /// The section, e.g. `TcpExt`.
    pub fn proto<'t>(&self, text: &'t [u8]) -> &'t str {
        ascii(&text[self.proto.clone()])
    }

    /// The field as the kernel spells it, e.g. `TCPSackRecovery`.
    pub fn field<'t>(&self, text: &'t [u8]) -> &'t str {
        ascii(&text[self.field.clone()])
    }
}

/// Names are checked to be ASCII alphanumerics and `_` when parsed.
fn ascii(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap_or_default()
}

/// Why a file was rejected (it is then not exported at all on that scrape).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A line does not start with `Name:`.
    #[error("line {line}: no \"Section:\" prefix")]
    NoSection {
        /// 1-based line number.
        line: usize,
    },
    /// A header line is the last line.
    #[error("line {line}: header of {proto} without a line of values")]
    NoValues {
        /// 1-based line number of the header.
        line: usize,
        /// The section.
        proto: String,
    },
    /// The values line belongs to another section than the header before it.
    #[error("line {line}: values of {values} after the header of {header}")]
    SectionMismatch {
        /// 1-based line number of the values.
        line: usize,
        /// The header's section.
        header: String,
        /// The values' section.
        values: String,
    },
    /// Header and values lines have different lengths.
    #[error("line {line}: {names} names but {values} values")]
    CountMismatch {
        /// 1-based line number of the values.
        line: usize,
        /// Number of names.
        names: usize,
        /// Number of values.
        values: usize,
    },
    /// A name that is not ASCII letters, digits and `_`.
    #[error("line {line}: {name:?} is not a field name")]
    BadName {
        /// 1-based line number.
        line: usize,
        /// The name, lossily decoded.
        name: String,
    },
    /// A value that is not an integer (or a negative counter).
    #[error("line {line}: {field} = {value:?} is not a valid value")]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// The field.
        field: String,
        /// The value, lossily decoded.
        value: String,
    },
}

/// Parses a netstat/snmp-format `text` into `out` (cleared first). On error `out` is left
/// cleared; nothing in the text can make it panic.
pub fn parse(text: &[u8], out: &mut Vec<Entry>) -> Result<(), ParseError> {
    out.clear();
    let result = parse_into(text, out);
    if result.is_err() {
        out.clear();
    }
    result
}

fn parse_into(text: &[u8], out: &mut Vec<Entry>) -> Result<(), ParseError> {
    let mut lines = Lines::new(text);
    while let Some((line_no, header)) = lines.next() {
        if header.is_empty() {
            continue;
        }
        let (proto, names) = section(text, header.clone(), line_no)?;
        let proto_name = || String::from_utf8_lossy(&text[proto.clone()]).into_owned();
        let Some((values_no, values_line)) = lines.next() else {
            return Err(ParseError::NoValues {
                line: line_no,
                proto: proto_name(),
            });
        };
        let (values_proto, values) = section(text, values_line, values_no)?;
        if text[values_proto.clone()] != text[proto.clone()] {
            return Err(ParseError::SectionMismatch {
                line: values_no,
                header: proto_name(),
                values: String::from_utf8_lossy(&text[values_proto]).into_owned(),
            });
        }
        let proto_str = ascii(&text[proto.clone()]);
        let mut names_iter = Tokens::new(text, names.clone());
        let mut values_iter = Tokens::new(text, values.clone());
        let (mut n_names, mut n_values) = (0, 0);
        loop {
            match (names_iter.next(), values_iter.next()) {
                (Some(name), Some(value)) => {
                    n_names += 1;
                    n_values += 1;
                    check_name(text, name.clone(), line_no)?;
                    let field = ascii(&text[name.clone()]);
                    let raw = &text[value];
                    let bad = || ParseError::BadValue {
                        line: values_no,
                        field: field.to_string(),
                        value: String::from_utf8_lossy(raw).into_owned(),
                    };
                    let value = if is_gauge(proto_str, field) {
                        Value::Gauge(parse_int(raw).ok_or_else(bad)?)
                    } else {
                        Value::Counter(parse_uint(raw).ok_or_else(bad)?)
                    };
                    out.push(Entry {
                        proto: proto.clone(),
                        field: name,
                        value,
                    });
                }
                (None, None) => break,
                (rest_names, rest_values) => {
                    n_names += usize::from(rest_names.is_some()) + names_iter.count();
                    n_values += usize::from(rest_values.is_some()) + values_iter.count();
                    return Err(ParseError::CountMismatch {
                        line: values_no,
                        names: n_names,
                        values: n_values,
                    });
                }
            }
        }
    }
    Ok(())
}

/// Splits `Name: rest` into the ranges of `Name` and `rest`.
fn section(
    text: &[u8],
    line: Range<usize>,
    line_no: usize,
) -> Result<(Range<usize>, Range<usize>), ParseError> {
    let bytes = &text[line.clone()];
    let colon = bytes
        .iter()
        .position(|&b| b == b':')
        .filter(|&i| i > 0)
        .ok_or(ParseError::NoSection { line: line_no })?;
    let proto = line.start..line.start + colon;
    check_name(text, proto.clone(), line_no)?;
    Ok((proto, line.start + colon + 1..line.end))
}

fn check_name(text: &[u8], name: Range<usize>, line: usize) -> Result<(), ParseError> {
    let bytes = &text[name];
    if bytes.is_empty()
        || !bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
    {
        return Err(ParseError::BadName {
            line,
            name: String::from_utf8_lossy(bytes).into_owned(),
        });
    }
    Ok(())
}

fn parse_uint(raw: &[u8]) -> Option<u64> {
    if raw.is_empty() || raw.len() > 20 {
        return None;
    }
    raw.iter().try_fold(0u64, |acc, &b| {
        b.is_ascii_digit()
            .then(|| acc.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
}

fn parse_int(raw: &[u8]) -> Option<i64> {
    match raw.split_first() {
        Some((b'-', digits)) => parse_uint(digits)
            .and_then(|v| i64::try_from(v).ok())
            .map(|v| -v),
        _ => parse_uint(raw).and_then(|v| i64::try_from(v).ok()),
    }
}

/// Lines of a text as byte ranges, numbered from 1.
struct Lines<'t> {
    text: &'t [u8],
    pos: usize,
    line: usize,
}

impl<'t> Lines<'t> {
    fn new(text: &'t [u8]) -> Self {
        Lines {
            text,
            pos: 0,
            line: 0,
        }
    }
}

impl Iterator for Lines<'_> {
    type Item = (usize, Range<usize>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.pos >= self.text.len() {
            return None;
        }
        let start = self.pos;
        let end = self.text[start..]
            .iter()
            .position(|&b| b == b'\n')
            .map_or(self.text.len(), |i| start + i);
        self.pos = end + 1;
        self.line += 1;
        Some((self.line, start..end))
    }
}

/// Space-separated tokens of a range of a text.
struct Tokens<'t> {
    text: &'t [u8],
    pos: usize,
    end: usize,
}

impl<'t> Tokens<'t> {
    fn new(text: &'t [u8], range: Range<usize>) -> Self {
        Tokens {
            text,
            pos: range.start,
            end: range.end,
        }
    }
}

impl Iterator for Tokens<'_> {
    type Item = Range<usize>;
    fn next(&mut self) -> Option<Self::Item> {
        let space = |b: &u8| *b == b' ' || *b == b'\t' || *b == b'\r';
        while self.pos < self.end && space(&self.text[self.pos]) {
            self.pos += 1;
        }
        if self.pos >= self.end {
            return None;
        }
        let start = self.pos;
        while self.pos < self.end && !space(&self.text[self.pos]) {
            self.pos += 1;
        }
        Some(start..self.pos)
    }
}

/// The collector of `<proc-root>/net/netstat` and `<proc-root>/net/snmp`.
#[derive(Debug)]
pub struct NetstatCollector {
    files: [(&'static str, PathBuf); 2],
    errors: ReadErrors,
    scratch: Mutex<[Scratch; 2]>,
    /// The user-space stack runner's stats file.
    userstack_stats: Option<PathBuf>,
}

/// Buffers kept between scrapes: the file's text and its parsed entries.
#[derive(Debug, Default)]
struct Scratch {
    text: Vec<u8>,
    entries: Vec<Entry>,
}

impl NetstatCollector {
    /// A collector of the files under `proc_root`, counting failures in `errors`.
    pub fn new(proc_root: &Path, errors: ReadErrors) -> Self {
        NetstatCollector {
            files: [
                ("netstat", proc_root.join("net/netstat")),
                ("snmp", proc_root.join("net/snmp")),
            ],
            errors,
            scratch: Mutex::default(),
            userstack_stats: None,
        }
    }

    /// Also exports the user-space stack's counters from its runner's stats file (absent while
    /// no stack runs: then there are none).
    pub fn with_userstack_stats(mut self, path: &Path) -> Self {
        self.userstack_stats = Some(path.to_path_buf());
        self
    }
}

impl Collector for NetstatCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        for ((name, path), s) in self.files.iter().zip(scratch.iter_mut()) {
            let result = read_into(path, &mut s.text)
                .map_err(|e| e.to_string())
                .and_then(|()| parse(&s.text, &mut s.entries).map_err(|e| e.to_string()));
            if let Err(e) = result {
                s.entries.clear();
                self.errors.failed(name, path, &e);
            }
        }
        let userstack = self
            .userstack_stats
            .as_deref()
            .and_then(crate::dataplane::stats::read);
        for (kind, help) in [
            (MetricType::Counter, "Counters of /proc/net/netstat and /proc/net/snmp, by section (proto) and field as the kernel names them"),
            (MetricType::Gauge, "Fields of /proc/net/snmp that are not counters (Tcp RtoAlgorithm, RtoMin, RtoMax, MaxConn, CurrEstab; Ip Forwarding, DefaultTTL)"),
        ] {
            let name = match kind {
                MetricType::Counter => "netstat",
                _ => "netstat_value",
            };
            let mut family = encoder.encode_descriptor(name, help, None, kind)?;
            for s in scratch.iter() {
                for entry in &s.entries {
                    let labels = [
                        ("stack", "kernel"),
                        ("proto", entry.proto(&s.text)),
                        ("field", entry.field(&s.text)),
                    ];
                    match entry.value {
                        Value::Counter(v) if kind == MetricType::Counter => family
                            .encode_family(&labels)?
                            .encode_counter::<NoLabelSet, _, u64>(&v, None)?,
                        Value::Gauge(v) if kind == MetricType::Gauge => {
                            family.encode_family(&labels)?.encode_gauge(&v)?
                        }
                        _ => {}
                    }
                }
            }
            let userspace = userstack.iter().flat_map(|s| &s.netstat).flat_map(|(proto, fields)| {
                fields.iter().map(move |(field, v)| (proto.as_str(), field.as_str(), *v))
            });
            for (proto, field, value) in userspace {
                let labels = [("stack", "userspace"), ("proto", proto), ("field", field)];
                match (is_gauge(proto, field), kind) {
                    (false, MetricType::Counter) => {
                        if let Ok(v) = u64::try_from(value) {
                            family
                                .encode_family(&labels)?
                                .encode_counter::<NoLabelSet, _, u64>(&v, None)?;
                        }
                    }
                    (true, MetricType::Gauge) => {
                        family.encode_family(&labels)?.encode_gauge(&value)?
                    }
                    _ => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(text: &str) -> Vec<(String, String, Value)> {
        let mut out = Vec::new();
        parse(text.as_bytes(), &mut out).expect("parses");
        out.iter()
            .map(|e| {
                (
                    e.proto(text.as_bytes()).to_string(),
                    e.field(text.as_bytes()).to_string(),
                    e.value,
                )
            })
            .collect()
    }

    #[test]
    fn pairs_of_lines() {
        let got = fields("TcpExt: TCPSackRecovery TCPDSACKRecv\nTcpExt: 7 3\nTcp: MaxConn CurrEstab RetransSegs\nTcp: -1 4 18446744073709551615\n");
        assert_eq!(
            got,
            vec![
                ("TcpExt".into(), "TCPSackRecovery".into(), Value::Counter(7)),
                ("TcpExt".into(), "TCPDSACKRecv".into(), Value::Counter(3)),
                ("Tcp".into(), "MaxConn".into(), Value::Gauge(-1)),
                ("Tcp".into(), "CurrEstab".into(), Value::Gauge(4)),
                ("Tcp".into(), "RetransSegs".into(), Value::Counter(u64::MAX)),
            ]
        );
    }

    #[test]
    fn empty_and_no_trailing_newline() {
        assert!(fields("").is_empty());
        assert_eq!(fields("Udp: InErrors\nUdp: 5").len(), 1);
    }

    #[test]
    fn malformed_is_an_error() {
        type Check = fn(&ParseError) -> bool;
        let table: &[(&str, Check)] = &[
            ("TcpExt: A B\n", |e| {
                matches!(e, ParseError::NoValues { line: 1, .. })
            }),
            ("TcpExt: A B\nTcpExt: 1\n", |e| {
                matches!(
                    e,
                    ParseError::CountMismatch {
                        line: 2,
                        names: 2,
                        values: 1
                    }
                )
            }),
            ("TcpExt: A\nTcpExt: 1 2 3\n", |e| {
                matches!(
                    e,
                    ParseError::CountMismatch {
                        names: 1,
                        values: 3,
                        ..
                    }
                )
            }),
            ("TcpExt: A\nIpExt: 1\n", |e| {
                matches!(e, ParseError::SectionMismatch { .. })
            }),
            ("TcpExt: A\nTcpExt: x\n", |e| {
                matches!(e, ParseError::BadValue { .. })
            }),
            ("TcpExt: A\nTcpExt: -1\n", |e| {
                matches!(e, ParseError::BadValue { .. })
            }),
            ("TcpExt: A\nTcpExt: 99999999999999999999999\n", |e| {
                matches!(e, ParseError::BadValue { .. })
            }),
            ("no colon here\n1 2\n", |e| {
                matches!(e, ParseError::NoSection { line: 1 })
            }),
            ("Tcp: A\"b\nTcp: 1\n", |e| {
                matches!(e, ParseError::BadName { .. })
            }),
            ("T cp: A\nT cp: 1\n", |e| {
                matches!(e, ParseError::BadName { .. })
            }),
        ];
        for (text, check) in table {
            let mut out = vec![];
            let err = parse(text.as_bytes(), &mut out).expect_err(text);
            assert!(check(&err), "{text:?}: {err:?}");
            assert!(out.is_empty());
        }
    }

    #[test]
    fn gauges_are_the_listed_ones() {
        assert!(is_gauge("Tcp", "CurrEstab"));
        assert!(!is_gauge("Tcp", "RetransSegs"));
        assert!(!is_gauge("TcpExt", "CurrEstab"));
    }
}
