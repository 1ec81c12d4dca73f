//! The exporter against recorded /proc files: this machine's kernel 6.18, an older kernel's
//! shape (fewer TcpExt/IpExt/Udp fields, no MPTcpExt, 11-column softnet_stat without the CPU
//! index), a file with a field and a section no kernel has yet, a malformed one, very long
//! lines and missing files. Every field of the file must be exported exactly once, under the
//! name the file spells, and a bad file must give an error count, never a panic.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hoststack_agent::exporter::Exporter;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/proc")
        .join(name)
}

/// The fields of a netstat-format file, read the plain way: (proto, field) → value.
fn fields_of(path: &Path) -> BTreeMap<(String, String), String> {
    let text = std::fs::read_to_string(path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = BTreeMap::new();
    for pair in lines.chunks(2) {
        let (proto, names) = pair[0].split_once(':').unwrap();
        let (_, values) = pair[1].split_once(':').unwrap();
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            assert!(
                out.insert((proto.to_string(), n.to_string()), v.to_string())
                    .is_none(),
                "{proto} {n} twice in {}",
                path.display()
            );
        }
    }
    out
}

/// The samples of the netstat families: (proto, field) → (family, value).
fn exported(text: &str) -> BTreeMap<(String, String), (String, String)> {
    let mut out = BTreeMap::new();
    for line in text.lines() {
        for family in ["hoststack_netstat_total", "hoststack_netstat_value"] {
            let Some(rest) = line.strip_prefix(&format!("{family}{{")) else {
                continue;
            };
            let (labels, value) = rest.split_once("} ").unwrap();
            let label = |key: &str| {
                labels
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{key}=\"")))
                    .and_then(|v| v.strip_suffix('"'))
                    .unwrap_or_else(|| panic!("no {key} in {line}"))
                    .to_string()
            };
            assert_eq!(label("stack"), "kernel", "{line}");
            let key = (label("proto"), label("field"));
            assert!(
                out.insert(key.clone(), (family.to_string(), value.to_string()))
                    .is_none(),
                "{key:?} exported twice"
            );
        }
    }
    out
}

fn sample<'t>(text: &'t str, prefix: &str) -> Option<&'t str> {
    text.lines()
        .find_map(|l| l.strip_prefix(prefix).and_then(|r| r.strip_prefix(' ')))
}

/// Every field of both files is exported once, with the file's value, gauges apart.
fn assert_every_field(root: &Path, text: &str) {
    let mut want = fields_of(&root.join("net/netstat"));
    want.extend(fields_of(&root.join("net/snmp")));
    let got = exported(text);
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "exported fields differ from the file's"
    );
    for (key, value) in &want {
        let (family, got) = &got[key];
        assert_eq!(got, value, "{key:?}");
        let gauge = hoststack_agent::exporter::netstat::is_gauge(&key.0, &key.1);
        let expected = if gauge {
            "hoststack_netstat_value"
        } else {
            "hoststack_netstat_total"
        };
        assert_eq!(family, expected, "{key:?}");
    }
}

#[test]
fn kernel_6_18_every_field_under_the_kernels_name() {
    let root = fixture("linux-6.18");
    let text = Exporter::new(&root).encode();
    assert_every_field(&root, &text);
    // The names of LAB-FACTS §6, as this kernel spells them, from the file.
    for field in [
        "TCPSackRecovery",
        "TCPSACKReneging",
        "TCPDSACKRecv",
        "TCPDSACKOldSent",
        "TCPSackFailures",
        "TCPTimeouts",
        "TCPLossProbes",
        "ListenDrops",
    ] {
        let prefix = format!(
            "hoststack_netstat_total{{stack=\"kernel\",proto=\"TcpExt\",field=\"{field}\"}}"
        );
        assert!(sample(&text, &prefix).is_some(), "{field} missing");
    }
    for (proto, field) in [
        ("Tcp", "RetransSegs"),
        ("Tcp", "OutSegs"),
        ("Udp", "InErrors"),
    ] {
        let prefix = format!(
            "hoststack_netstat_total{{stack=\"kernel\",proto=\"{proto}\",field=\"{field}\"}}"
        );
        assert!(sample(&text, &prefix).is_some(), "{proto} {field} missing");
    }
    assert_eq!(
        sample(
            &text,
            "hoststack_netstat_value{stack=\"kernel\",proto=\"Tcp\",field=\"MaxConn\"}"
        ),
        Some("-1")
    );
    // softnet_stat with the CPU index column.
    assert_eq!(
        sample(&text, "hoststack_softnet_processed_total{cpu=\"0\"}"),
        Some("215220")
    );
    assert!(sample(&text, "hoststack_softnet_backlog_len{cpu=\"1\"}").is_some());
    assert_eq!(
        sample(
            &text,
            "hoststack_exporter_read_errors_total{file=\"netstat\"}"
        ),
        Some("0")
    );
    assert!(text.ends_with("# EOF\n"));
}

#[test]
fn older_kernel_fewer_fields() {
    let root = fixture("older-shape");
    let text = Exporter::new(&root).encode();
    assert_every_field(&root, &text);
    assert!(!text.contains("proto=\"MPTcpExt\""));
    assert!(!text.contains("field=\"TCPMigrateReqSuccess\""));
    // No index column: the line number is the CPU; no backlog column.
    assert_eq!(
        sample(&text, "hoststack_softnet_processed_total{cpu=\"1\"}"),
        Some("16772609")
    );
    assert_eq!(
        sample(&text, "hoststack_softnet_received_rps_total{cpu=\"1\"}"),
        Some("7")
    );
    assert!(!text.contains("hoststack_softnet_backlog_len"));
}

#[test]
fn unknown_fields_and_sections_are_exported_too() {
    let root = fixture("unknown-fields");
    let text = Exporter::new(&root).encode();
    assert_every_field(&root, &text);
    assert_eq!(
        sample(
            &text,
            "hoststack_netstat_total{stack=\"kernel\",proto=\"TcpExt\",field=\"TCPFutureCounter\"}"
        ),
        Some("42")
    );
    assert_eq!(
        sample(
            &text,
            "hoststack_netstat_total{stack=\"kernel\",proto=\"FutureExt\",field=\"Beta\"}"
        ),
        Some("2")
    );
}

#[test]
fn a_malformed_file_is_left_out_and_counted() {
    let root = fixture("malformed");
    let exporter = Exporter::new(&root);
    let text = exporter.encode();
    assert!(
        !text.contains("proto=\"TcpExt\""),
        "nothing of a bad netstat"
    );
    assert!(
        text.contains("proto=\"Tcp\",field=\"RetransSegs\""),
        "snmp is fine"
    );
    assert!(!text.contains("hoststack_softnet_processed"));
    let again = exporter.encode();
    assert_eq!(
        sample(
            &again,
            "hoststack_exporter_read_errors_total{file=\"netstat\"}"
        ),
        Some("2")
    );
    assert_eq!(
        sample(
            &again,
            "hoststack_exporter_read_errors_total{file=\"softnet_stat\"}"
        ),
        Some("2")
    );
    assert_eq!(
        sample(
            &again,
            "hoststack_exporter_read_errors_total{file=\"snmp\"}"
        ),
        Some("0")
    );
}

#[test]
fn missing_files_give_errors_not_panics() {
    let exporter = Exporter::new(Path::new("/nonexistent/proc"));
    let text = exporter.encode();
    assert!(!text.contains("hoststack_netstat_total{"));
    assert!(text.contains("hoststack_node_info{tuning=\"\",revision=\"\",phase=\"baseline\"} 1"));
}

#[test]
fn long_lines() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("net")).unwrap();
    let names: Vec<String> = (0..20_000).map(|i| format!("TCPField{i}")).collect();
    let values: Vec<String> = (0..20_000u64)
        .map(|i| (i * 1_000_003).to_string())
        .collect();
    let netstat = format!(
        "TcpExt: {}\nTcpExt: {}\n",
        names.join(" "),
        values.join(" ")
    );
    std::fs::write(dir.path().join("net/netstat"), netstat).unwrap();
    std::fs::copy(
        fixture("linux-6.18").join("net/snmp"),
        dir.path().join("net/snmp"),
    )
    .unwrap();
    let text = Exporter::new(dir.path()).encode();
    assert_every_field(dir.path(), &text);
    assert_eq!(
        sample(
            &text,
            "hoststack_netstat_total{stack=\"kernel\",proto=\"TcpExt\",field=\"TCPField19999\"}"
        ),
        Some("19999059997")
    );
}

/// `promtool check metrics` (Debian's prometheus package, which scripts/setup.sh installs)
/// accepts the output.
#[test]
fn promtool_accepts_the_output() {
    let out = std::process::Command::new("promtool")
        .arg("--version")
        .output()
        .expect("promtool runs (scripts/setup.sh installs Debian's prometheus package)");
    assert!(out.status.success());
    let text = Exporter::new(&fixture("linux-6.18"))
        .encode_as(hoststack_agent::exporter::Format::PrometheusText);
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool: {said}");
    assert!(!said.contains("error"), "promtool: {said}");
}
