//! The evaluation's generator (`userstack-eval docs`) still runs and writes what
//! docs/evaluation.md shows: the simulator's rows with one seed here (the published figures
//! use five), and the real link's table from given measurements, marked against Linux.

use std::process::Command;

/// Two pairings of one row: userstack 1.5 % below Linux (equal) and Linux → userstack with
/// twice the retransmissions (worse).
const LINK: &str = r#"[
  {"row": "1 flow, 1 % loss", "pairing": "linuxToLinux", "seconds": 20.0, "flowMbps": [40.0],
   "sender": {"Tcp": {"OutSegs": 100000, "RetransSegs": 1000}, "TcpExt": {"TCPSackRecovery": 300}},
   "receiver": {}},
  {"row": "1 flow, 1 % loss", "pairing": "userstackToLinux", "seconds": 20.0, "flowMbps": [39.4],
   "sender": {"Tcp": {"OutSegs": 100000, "RetransSegs": 1010}, "TcpExt": {"TCPSackRecovery": 280, "TCPTimeouts": 2}},
   "receiver": {}},
  {"row": "1 flow, 1 % loss", "pairing": "linuxToUserstack", "seconds": 20.0, "flowMbps": [40.0],
   "sender": {"Tcp": {"OutSegs": 100000, "RetransSegs": 2000}},
   "receiver": {}}
]"#;

#[test]
fn the_evaluation_generator_writes_both_tables_and_the_plots() {
    let dir = std::env::temp_dir().join(format!("userstack-eval-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("link.json");
    std::fs::write(&link, LINK).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_userstack-eval"))
        .args(["docs", "--seeds", "1", "--link"])
        .arg(&link)
        .arg("--write")
        .arg(&dir)
        .output()
        .expect("userstack-eval runs");
    let doc = std::fs::read_to_string(dir.join("evaluation.md")).unwrap_or_default();
    let plots: Vec<String> = ["throughput-over-time.svg", "sack-vs-no-sack.svg"]
        .iter()
        .map(|name| std::fs::read_to_string(dir.join("evaluation").join(name)).unwrap_or_default())
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        output.status.success(),
        "userstack-eval failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let (link_part, sim_part) = doc
        .split_once("## In the simulator")
        .expect("both sections");
    let sim_rows = sim_part
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" flow"))
        .count();
    assert_eq!(sim_rows, 10, "{doc}");
    let line = |pairing: &str| {
        link_part
            .lines()
            .find(|l| l.starts_with("| 1 flow, 1 % loss | ") && l.contains(pairing))
            .unwrap_or_else(|| panic!("no {pairing} line in {link_part}"))
            .to_string()
    };
    assert!(
        line("| Linux → Linux |").contains("| 40.00 | 1.000 | 1.00 | 300 | 0 | 0 | reference |")
    );
    assert!(
        line("| userstack → Linux |").contains("| 39.40 | 1.000 | 1.01 | 280 | 2 | 0 | equal |")
    );
    assert!(line("| Linux → userstack |").contains("| worse |"));
    for plot in &plots {
        assert!(
            plot.contains(">\nSACK\n<") && plot.contains(">\nno SACK\n<"),
            "{plot}"
        );
        assert!(plot.matches("<polyline").count() >= 2, "{plot}");
    }
    assert!(doc.contains("userstack-eval docs --seeds 1 --link"));
}

#[test]
fn bad_arguments_are_refused_with_usage() {
    for args in [
        &["docs"][..],
        &["docs", "--write"],
        &["link", "--out", "x.json"],
        &[
            "link",
            "--runner",
            "r",
            "--out",
            "x",
            "--rows",
            "no such row",
        ],
        &[
            "link",
            "--runner",
            "r",
            "--out",
            "x",
            "--pairings",
            "linux-bsd",
        ],
        &["sim", "--seeds", "0"],
        &["bogus"],
    ] {
        let output = Command::new(env!("CARGO_BIN_EXE_userstack-eval"))
            .args(args)
            .output()
            .expect("userstack-eval runs");
        assert_eq!(output.status.code(), Some(2), "{args:?}");
        assert!(
            String::from_utf8_lossy(&output.stderr).contains("usage: userstack-eval"),
            "{args:?}"
        );
    }
}
