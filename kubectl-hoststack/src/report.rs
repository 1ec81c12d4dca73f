//! `report`: a picture of a rollout over time. Pure steps: which span and step to ask
//! Prometheus for, the Rollout dashboard's queries, Prometheus' range answers (decoded by
//! `hoststack-promql`) and the tuning's status → series and markers ([`Report`]), and the
//! report → an SVG of three stacked panels.

use hoststack_crds::{NetworkTuningStatus, Phase};
use k8s_openapi::jiff::Timestamp;
use plotters::prelude::*;
use serde::Serialize;

use crate::error::{Error, Result};

/// How far before the first marker the picture starts when `--since` is not given (seconds).
pub const LEAD_IN: f64 = 60.0;
/// The span shown when `--since` is not given and the tuning has no marker yet (seconds).
pub const DEFAULT_SPAN: f64 = 15.0 * 60.0;
/// About how many points each series gets; the step is the span divided by this, in whole
/// seconds.
pub const POINTS: f64 = 300.0;

/// One panel: a kernel TCP counter per segment sent, by rollout phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Metric {
    /// The panel's title (the Rollout dashboard's).
    pub title: &'static str,
    /// The netstat counter counted: `(proto, field)`.
    pub counter: (&'static str, &'static str),
    /// The factor the ratio is shown with (1 for a ratio, 1000 for "per 1000 segments").
    pub scale: u32,
}

/// The three panels, top to bottom, as on the Rollout dashboard.
pub const METRICS: [Metric; 3] = [
    Metric {
        title: "Retransmit ratio by phase",
        counter: ("Tcp", "RetransSegs"),
        scale: 1,
    },
    Metric {
        title: "SACK recoveries per 1000 segments by phase",
        counter: ("TcpExt", "TCPSackRecovery"),
        scale: 1000,
    },
    Metric {
        title: "D-SACKs received per 1000 segments by phase",
        counter: ("TcpExt", "TCPDSACKRecv"),
        scale: 1000,
    },
];

/// The dashboard's query for `metric` on `tuning`'s nodes, split by phase, with a `rate_window`
/// seconds rate.
pub fn query(metric: &Metric, tuning: &str, rate_window: u64) -> String {
    let by_phase = |proto: &str, field: &str| {
        format!(
            "sum by (phase) (rate(hoststack_netstat_total{{stack=\"kernel\", proto=\"{proto}\", field=\"{field}\"}}[{rate_window}s]) * on(node) group_left(phase) hoststack_node_info{{tuning=\"{tuning}\"}})"
        )
    };
    let (proto, field) = metric.counter;
    let scale = if metric.scale == 1 {
        String::new()
    } else {
        format!("{} * ", metric.scale)
    };
    format!(
        "{scale}{} / {}",
        by_phase(proto, field),
        by_phase("Tcp", "OutSegs")
    )
}

/// The time range asked for, and its resolution.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Span {
    /// First instant (Unix seconds).
    pub start: f64,
    /// Last instant (Unix seconds).
    pub end: f64,
    /// Seconds between points.
    pub step: u64,
    /// The rate window of the queries, in seconds: four steps, and at least 5 s (so that even
    /// a 1 s scrape interval gives several samples).
    pub rate_window: u64,
}

/// The span up to `now`: the last `since` seconds, or else from [`LEAD_IN`] before the first
/// marker (or the last [`DEFAULT_SPAN`] when there is none).
pub fn span(markers: &[Marker], now: f64, since: Option<f64>) -> Span {
    let start = match since {
        Some(s) => now - s,
        None => markers
            .iter()
            .map(|m| m.at)
            .reduce(f64::min)
            .map_or(now - DEFAULT_SPAN, |first| first.min(now) - LEAD_IN),
    };
    let step = ((now - start) / POINTS).ceil().max(1.0) as u64;
    Span {
        start: start.floor(),
        end: now.ceil(),
        step,
        rate_window: (4 * step).max(5),
    }
}

/// One phase's line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Series {
    /// The rollout phase (`canary`, `baseline`, `stable`...), from the `phase` label.
    pub phase: String,
    /// `[Unix seconds, value]`, in time order; instants without a finite value are left out.
    pub points: Vec<[f64; 2]>,
}

/// The series of a range query's matrix, one per phase, sorted by phase.
pub fn series(matrix: Vec<hoststack_promql::Series>) -> Vec<Series> {
    let mut out: Vec<Series> = matrix
        .into_iter()
        .map(|s| Series {
            phase: s
                .labels
                .get("phase")
                .map_or("(no phase)", String::as_str)
                .to_string(),
            points: s
                .points
                .into_iter()
                .filter(|(_, value)| value.is_finite())
                .map(|(t, value)| [t, value])
                .collect(),
        })
        .collect();
    out.sort_by(|a, b| a.phase.cmp(&b.phase));
    out
}

/// What a marker marks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum MarkerKind {
    /// Every node of wave `wave` had applied the revision.
    WaveApplied {
        /// The wave's index (0 is the canary).
        wave: u32,
    },
    /// The rollout was rolled back to the stable revision.
    RolledBack,
}

/// A vertical line at a moment of the rollout.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Marker {
    /// What happened.
    #[serde(flatten)]
    pub kind: MarkerKind,
    /// When, as Unix seconds.
    pub at: f64,
    /// When, as the status wrote it (RFC 3339).
    pub time: String,
    /// The text drawn next to the line.
    pub label: String,
}

fn marker(kind: MarkerKind, time: &str, label: String) -> Option<Marker> {
    let at: Timestamp = time.parse().ok()?;
    Some(Marker {
        kind,
        at: at.as_millisecond() as f64 / 1000.0,
        time: time.to_string(),
        label,
    })
}

/// Each wave's `appliedAt` and, for a rolled-back rollout, the moment it rolled back (the
/// `Degraded` condition with reason `RolledBack`, else `Progressing` with that reason), in
/// time order. Times that do not parse are left out.
pub fn markers(status: &NetworkTuningStatus) -> Vec<Marker> {
    let mut out: Vec<Marker> = status
        .waves
        .iter()
        .filter_map(|w| {
            let name = if w.index == 0 { "canary" } else { "wave" };
            marker(
                MarkerKind::WaveApplied { wave: w.index },
                w.applied_at.as_deref()?,
                format!("{name} {} applied", w.index),
            )
        })
        .collect();
    if status.phase == Some(Phase::RolledBack) {
        let rolled_back = ["Degraded", "Progressing"].iter().find_map(|kind| {
            status
                .conditions
                .iter()
                .find(|c| c.type_ == *kind && c.reason == "RolledBack")
        });
        if let Some(c) = rolled_back {
            out.extend(marker(
                MarkerKind::RolledBack,
                &c.last_transition_time.0.to_string(),
                "rolled back".into(),
            ));
        }
    }
    out.sort_by(|a, b| a.at.total_cmp(&b.at));
    out
}

/// One panel's data.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Panel {
    /// Its title.
    pub title: String,
    /// The PromQL asked.
    pub query: String,
    /// One line per phase.
    pub series: Vec<Series>,
}

/// Everything the picture shows, also written by `--data` for scripts.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// The NetworkTuning's name.
    pub tuning: String,
    /// The time range and step.
    pub span: Span,
    /// The three panels, top to bottom.
    pub panels: Vec<Panel>,
    /// The rollout's moments.
    pub markers: Vec<Marker>,
}

/// The picture's size in pixels.
pub const SIZE: (u32, u32) = (960, 900);

fn colour(phase: &str) -> RGBColor {
    match phase {
        "canary" => RGBColor(214, 39, 40),
        "baseline" => RGBColor(31, 119, 180),
        "stable" => RGBColor(44, 160, 44),
        _ => RGBColor(127, 127, 127),
    }
}

fn marker_colour(kind: MarkerKind) -> RGBColor {
    match kind {
        MarkerKind::WaveApplied { .. } => RGBColor(255, 127, 14),
        MarkerKind::RolledBack => RGBColor(148, 103, 189),
    }
}

/// The time axis of every panel: the span, less what comes before the first point and marker
/// (Prometheus may hold nothing that old), and at least a second wide.
pub fn time_axis(report: &Report) -> (f64, f64) {
    let (start, end) = (report.span.start, report.span.end);
    let first = report
        .panels
        .iter()
        .flat_map(|p| {
            p.series
                .iter()
                .flat_map(|s| s.points.first().map(|[t, _]| *t))
        })
        .chain(report.markers.iter().map(|m| m.at))
        .reduce(f64::min)
        .map_or(start, |t| t.clamp(start, end));
    (first, end.max(first + 1.0))
}

/// `HH:MM:SS` (UTC) of a Unix time.
pub fn clock(at: f64) -> String {
    Timestamp::from_millisecond((at * 1000.0) as i64)
        .map(|t| t.strftime("%H:%M:%S").to_string())
        .unwrap_or_default()
}

/// The report as an SVG document: the panels stacked, time (UTC) across, each phase a line,
/// each marker a labelled vertical line. Text is SVG `<text>`, so no font files are needed.
pub fn draw(report: &Report) -> Result<String> {
    let mut svg = String::new();
    draw_into(report, &mut svg).map_err(|e| Error::Output(format!("drawing: {e}")))?;
    Ok(svg)
}

fn draw_into(report: &Report, svg: &mut String) -> std::result::Result<(), String> {
    let root = SVGBackend::with_string(svg, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let (top, body) = root.split_vertically(30);
    top.draw(&Text::new(
        format!(
            "NetworkTuning {}: canary against baseline, {} to {} UTC (step {}s)",
            report.tuning,
            clock(time_axis(report).0),
            clock(time_axis(report).1),
            report.span.step
        ),
        (10, 8),
        ("sans-serif", 16).into_font(),
    ))
    .map_err(|e| e.to_string())?;
    let areas = body.split_evenly((report.panels.len().max(1), 1));
    for (panel, area) in report.panels.iter().zip(areas.iter()) {
        draw_panel(report, panel, area).map_err(|e| e.to_string())?;
    }
    root.present().map_err(|e| e.to_string())
}

fn draw_panel<DB: DrawingBackend>(
    report: &Report,
    panel: &Panel,
    area: &DrawingArea<DB, plotters::coord::Shift>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (start, end) = time_axis(report);
    let top = panel
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|[_, v]| *v))
        .fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(25)
        .y_label_area_size(60)
        .build_cartesian_2d(start..end, 0.0..top)?;
    chart
        .configure_mesh()
        .x_labels(8)
        .y_labels(5)
        .x_label_formatter(&|t| clock(*t))
        .y_label_formatter(&|v| format!("{v:.3}"))
        .draw()?;
    let shown = report
        .markers
        .iter()
        .filter(|m| (start..=end).contains(&m.at));
    for (i, m) in shown.enumerate() {
        let style = marker_colour(m.kind).stroke_width(1);
        chart.draw_series(LineSeries::new([(m.at, 0.0), (m.at, top)], style))?;
        // Labels step down the line so that close markers' labels do not overlap.
        chart.draw_series(std::iter::once(Text::new(
            m.label.clone(),
            (m.at, top * (1.0 - 0.1 * (i % 4) as f64)),
            ("sans-serif", 12).into_font().color(&marker_colour(m.kind)),
        )))?;
    }
    for s in &panel.series {
        let c = colour(&s.phase);
        chart
            .draw_series(LineSeries::new(
                s.points.iter().map(|[t, v]| (*t, *v)),
                c.stroke_width(2),
            ))?
            .label(s.phase.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], c.stroke_width(2)));
    }
    if !panel.series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use hoststack_crds::WaveStatus;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use serde_json::{json, Value};

    fn status() -> NetworkTuningStatus {
        let condition = |type_: &str, reason: &str, at: &str| Condition {
            type_: type_.into(),
            status: "True".into(),
            reason: reason.into(),
            message: String::new(),
            last_transition_time: Time(at.parse().unwrap()),
            observed_generation: None,
        };
        NetworkTuningStatus {
            phase: Some(Phase::RolledBack),
            waves: vec![
                WaveStatus {
                    index: 1,
                    nodes: vec!["node-b".into()],
                    result: "RolledBack".into(),
                    applied_at: Some("2026-11-30T02:00:20Z".into()),
                    analysis: None,
                    from: Vec::new(),
                },
                WaveStatus {
                    index: 0,
                    nodes: vec!["node-a".into()],
                    result: "RolledBack".into(),
                    applied_at: Some("2026-11-30T02:00:00Z".into()),
                    analysis: None,
                    from: Vec::new(),
                },
                WaveStatus {
                    index: 2,
                    nodes: vec!["node-c".into()],
                    result: "Pending".into(),
                    applied_at: None,
                    analysis: None,
                    from: Vec::new(),
                },
            ],
            conditions: vec![
                condition("Ready", "Stable", "2026-11-30T01:00:00Z"),
                condition("Degraded", "RolledBack", "2026-11-30T02:00:30Z"),
            ],
            ..NetworkTuningStatus::default()
        }
    }

    const T0: f64 = 1_796_004_000.0; // 2026-11-30T02:00:00Z

    #[test]
    fn markers_are_the_waves_applied_times_then_the_rollback_in_time_order() {
        let m = markers(&status());
        let kinds: Vec<_> = m.iter().map(|m| (m.kind, m.at - T0)).collect();
        assert_eq!(
            kinds,
            [
                (MarkerKind::WaveApplied { wave: 0 }, 0.0),
                (MarkerKind::WaveApplied { wave: 1 }, 20.0),
                (MarkerKind::RolledBack, 30.0),
            ]
        );
        assert_eq!(m[0].label, "canary 0 applied");
        assert_eq!(m[0].time, "2026-11-30T02:00:00Z");
        assert_eq!(m[2].time, "2026-11-30T02:00:30Z");
        // Not rolled back: no rollback marker, even with an old condition around.
        let mut complete = status();
        complete.phase = Some(Phase::Complete);
        assert_eq!(markers(&complete).len(), 2);
        let json = serde_json::to_value(&m[0]).unwrap();
        assert_eq!(json["kind"], "waveApplied");
        assert_eq!(json["wave"], 0);
        assert_eq!(serde_json::to_value(&m[2]).unwrap()["kind"], "rolledBack");
    }

    #[test]
    fn the_span_starts_before_the_first_marker_or_since_ago_and_the_step_fits_it() {
        let m = markers(&status());
        let s = span(&m, T0 + 90.0, None);
        assert_eq!(
            (s.start, s.end, s.step, s.rate_window),
            (T0 - 60.0, T0 + 90.0, 1, 5)
        );
        let s = span(&m, T0 + 3600.0, Some(3600.0));
        assert_eq!((s.start, s.step, s.rate_window), (T0, 12, 48));
        let s = span(&[], T0, None);
        assert_eq!((s.start, s.step), (T0 - DEFAULT_SPAN, 3));
    }

    #[test]
    fn the_queries_are_the_rollout_dashboards() {
        let q = query(&METRICS[0], "edge", 5);
        assert_eq!(
            q,
            "sum by (phase) (rate(hoststack_netstat_total{stack=\"kernel\", proto=\"Tcp\", field=\"RetransSegs\"}[5s]) * on(node) group_left(phase) hoststack_node_info{tuning=\"edge\"}) / sum by (phase) (rate(hoststack_netstat_total{stack=\"kernel\", proto=\"Tcp\", field=\"OutSegs\"}[5s]) * on(node) group_left(phase) hoststack_node_info{tuning=\"edge\"})"
        );
        let q = query(&METRICS[2], "edge", 8);
        assert!(
            q.starts_with("1000 * sum by (phase) (rate(hoststack_netstat_total{stack=\"kernel\", proto=\"TcpExt\", field=\"TCPDSACKRecv\"}[8s])"),
            "{q}"
        );
        // The same shape as the dashboard's panel, once Grafana's variables are filled in.
        let dashboard: Value = serde_json::from_str(include_str!(
            "../../charts/hoststack/dashboards/rollout.json"
        ))
        .unwrap();
        let normalise = |s: &str| s.split_whitespace().collect::<String>();
        for metric in &METRICS {
            let panel = dashboard["panels"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["title"] == metric.title)
                .expect("the dashboard has the panel");
            let expr = panel["targets"][0]["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "5s")
                .replace("$tuning", "edge")
                .replace(", node=~\"$node\"", "");
            assert_eq!(
                normalise(&expr),
                normalise(&query(metric, "edge", 5)),
                "{}",
                metric.title
            );
        }
    }

    #[test]
    fn range_answers_become_series_per_phase_without_nan() {
        // The answer's data as Prometheus sends it, decoded as the client does.
        let matrix = |data: Value| {
            let answer = json!({"status": "success", "data": data});
            hoststack_promql::decode(answer.to_string().as_bytes())?.into_matrix()
        };
        let data = json!({
            "resultType": "matrix",
            "result": [
                {"metric": {"phase": "canary"}, "values": [[T0, "0.03"], [T0 + 1.0, "NaN"], [T0 + 2.0, "0.05"]]},
                {"metric": {"phase": "baseline"}, "values": [[T0, "0.001"], [T0 + 1.0, "+Inf"]]},
            ]
        });
        let s = series(matrix(data).unwrap());
        assert_eq!(
            s,
            [
                Series {
                    phase: "baseline".into(),
                    points: vec![[T0, 0.001]]
                },
                Series {
                    phase: "canary".into(),
                    points: vec![[T0, 0.03], [T0 + 2.0, 0.05]]
                },
            ]
        );
        let e = matrix(json!({"resultType": "vector", "result": []})).unwrap_err();
        assert!(e.to_string().contains("instead of matrix"), "{e}");
        let e = matrix(
            json!({"resultType": "matrix", "result": [{"metric": {}, "values": [[T0, "x"]]}]}),
        )
        .unwrap_err();
        assert!(e.to_string().contains("not a number"), "{e}");
    }

    #[test]
    fn the_svg_has_a_panel_per_metric_a_line_per_phase_and_the_markers() {
        let m = markers(&status());
        let panels = METRICS
            .iter()
            .map(|metric| Panel {
                title: metric.title.into(),
                query: query(metric, "edge", 5),
                series: vec![
                    Series {
                        phase: "canary".into(),
                        points: vec![[T0, 0.0], [T0 + 10.0, 0.04], [T0 + 30.0, 0.0]],
                    },
                    Series {
                        phase: "baseline".into(),
                        points: vec![[T0, 0.001], [T0 + 30.0, 0.002]],
                    },
                ],
            })
            .collect();
        let report = Report {
            tuning: "edge".into(),
            span: span(&m, T0 + 60.0, None),
            panels,
            markers: m,
        };
        // The axis starts at the first marker: nothing is known before it.
        assert_eq!(time_axis(&report), (T0, T0 + 60.0));
        let svg = draw(&report).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..100]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for metric in &METRICS {
            assert!(svg.contains(metric.title), "{}", metric.title);
        }
        for text in [
            "canary 0 applied",
            "wave 1 applied",
            "rolled back",
            "\ncanary\n",
            "\nbaseline\n",
        ] {
            assert_eq!(svg.matches(text).count(), 3, "{text} once per panel");
        }
        let lines = |colour: RGBColor| {
            let RGBColor(r, g, b) = colour;
            svg.matches(&format!(
                "<polyline fill=\"none\" opacity=\"1\" stroke=\"#{r:02X}{g:02X}{b:02X}\""
            ))
            .count()
        };
        // Each panel: the canary's and the baseline's line and legend sample, and the
        // markers' lines.
        assert_eq!(lines(colour("canary")), 3 * 2);
        assert_eq!(lines(colour("baseline")), 3 * 2);
        assert_eq!(
            lines(marker_colour(MarkerKind::WaveApplied { wave: 0 })),
            3 * 2
        );
        assert_eq!(lines(marker_colour(MarkerKind::RolledBack)), 3);
        // An empty report still draws its axes.
        let empty = Report {
            tuning: "edge".into(),
            span: span(&[], T0, Some(60.0)),
            panels: vec![Panel {
                title: "x".into(),
                query: String::new(),
                series: vec![],
            }],
            markers: vec![],
        };
        assert_eq!(time_axis(&empty), (T0 - 60.0, T0));
        assert!(draw(&empty).unwrap().starts_with("<svg"));
    }
}
