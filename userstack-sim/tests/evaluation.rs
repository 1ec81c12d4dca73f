//! The evaluation's generator (`userstack-eval`) still runs and writes what docs/evaluation.md
//! shows: one seed per row here; the published figures use five.

use std::process::Command;

#[test]
fn the_evaluation_generator_writes_its_table_and_plots() {
    let dir = std::env::temp_dir().join(format!("userstack-eval-{}", std::process::id()));
    let output = Command::new(env!("CARGO_BIN_EXE_userstack-eval"))
        .args(["--seeds", "1", "--write"])
        .arg(&dir)
        .output()
        .expect("userstack-eval runs");
    let cleanup = || std::fs::remove_dir_all(&dir).ok();
    assert!(
        output.status.success(),
        "userstack-eval failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let doc = std::fs::read_to_string(dir.join("evaluation.md")).expect("evaluation.md");
    let rows = doc
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains(" flow"))
        .count();
    let plots: Vec<String> = ["throughput-over-time.svg", "sack-vs-no-sack.svg"]
        .iter()
        .map(|name| std::fs::read_to_string(dir.join("evaluation").join(name)).unwrap_or_default())
        .collect();
    cleanup();
    assert_eq!(rows, 10, "{doc}");
    for plot in &plots {
        assert!(
            plot.contains(">\nSACK\n<") && plot.contains(">\nno SACK\n<"),
            "{plot}"
        );
        assert!(plot.matches("<polyline").count() >= 2, "{plot}");
    }
    assert!(doc.contains("userstack-eval -- --seeds 1 --write"));
}
