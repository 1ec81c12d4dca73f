//! The chart's Grafana dashboards against Grafana's own dashboard schema, as the Grafana
//! foundation SDK carries it: scripts/dashboard-schema (built by scripts/setup.sh into the
//! control-plane cache) decodes each dashboard strictly (a field the schema lacks is an
//! error), validates it, and refuses a panel type the schema has no plugin for (unknown, or
//! deprecated such as graph, singlestat and table-old). No lab: this runs a program on files.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Output;

const DASHBOARDS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../charts/hoststack/dashboards"
);

/// `dashboard-schema FILE...`.
fn check(files: &[PathBuf]) -> Output {
    let checker = hoststack_e2e::control_plane_dir().join("dashboard-schema");
    assert!(
        checker.exists(),
        "no dashboard schema check at {}: run scripts/setup.sh",
        checker.display()
    );
    std::process::Command::new(&checker)
        .args(files)
        .output()
        .expect("the dashboard schema check runs")
}

/// The chart's dashboards (every .json file of charts/hoststack/dashboards).
fn dashboards() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(DASHBOARDS)
        .expect("the chart's dashboards directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
}

/// The node dashboard with `change` applied to its first panel, written to `name`.
fn altered_node_dashboard(name: &str, change: impl FnOnce(&mut Value)) -> PathBuf {
    let node = Path::new(DASHBOARDS).join("node.json");
    let mut board: Value =
        serde_json::from_str(&std::fs::read_to_string(node).expect("node.json")).unwrap();
    change(&mut board["panels"][0]);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::write(&path, board.to_string()).expect("writing the altered dashboard");
    path
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn every_dashboard_of_the_chart_passes_grafanas_schema() {
    let files = dashboards();
    let names: Vec<_> = files.iter().filter_map(|p| p.file_name()).collect();
    assert_eq!(names, ["node.json", "rollout.json", "userspace.json"]);
    let out = check(&files);
    assert!(out.status.success(), "{}", text(&out));
}

#[test]
fn deprecated_panel_types_are_refused() {
    for kind in ["graph", "singlestat", "table-old"] {
        let file = altered_node_dashboard(&format!("{kind}-panel.json"), |panel| {
            panel["type"] = kind.into();
        });
        let out = check(&[file]);
        assert_eq!(out.status.code(), Some(1), "{kind}: {}", text(&out));
        assert!(
            text(&out).contains(&format!(
                "panel \"Retransmit ratio\": type \"{kind}\" is unknown to Grafana's schema"
            )),
            "{kind}: {}",
            text(&out)
        );
    }
}

#[test]
fn a_field_the_schema_lacks_is_refused() {
    let file = altered_node_dashboard("unknown-field.json", |panel| {
        panel["options"]["legend"]["showLegends"] = true.into();
    });
    let out = check(&[file]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out)
            .contains("panels[0].options.legend.VizLegendOptions: unexpected field 'showLegends'"),
        "{}",
        text(&out)
    );
}
