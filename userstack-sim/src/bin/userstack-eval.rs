//! The simulator's half of the evaluation: `userstack-eval [--seeds N] [--write DOCS_DIR]`
//! runs the evaluation's rows (100 Mbit/s, 20 ms RTT, a 250-packet drop-tail queue: 1, 8 and
//! 16 flows; 1 % and 5 % loss with 1 and 8 flows; 5 % loss without SACK; 1 ms of jitter;
//! four flows of 20-80 ms RTT) over seeds 1..=N (default 5), prints the table as Markdown,
//! and with `--write` regenerates `DOCS_DIR/evaluation.md` and the plots it shows
//! (`DOCS_DIR/evaluation/*.svg`) from the same runs.

use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use userstack_sim::metrics::Report;
use userstack_sim::scenario::Scenario;
use userstack_sim::{median, run, run_observed};

const USAGE: &str = "usage: userstack-eval [--seeds N] [--write DOCS_DIR]";

/// One row: its label and the scenario's variable parts.
struct Row {
    label: &'static str,
    flows: usize,
    loss: f64,
    sack: bool,
    jitter_ms: f64,
    pair_rtts: &'static str,
}

const ROWS: [Row; 9] = [
    row("1 flow", 1, 0.0, true, 0.0, ""),
    row("8 flows", 8, 0.0, true, 0.0, ""),
    row("16 flows", 16, 0.0, true, 0.0, ""),
    row("1 flow, 1 % loss", 1, 0.01, true, 0.0, ""),
    row("8 flows, 1 % loss", 8, 0.01, true, 0.0, ""),
    row("1 flow, 5 % loss", 1, 0.05, true, 0.0, ""),
    row("8 flows, 5 % loss", 8, 0.05, true, 0.0, ""),
    row("1 flow, 5 % loss, SACK off", 1, 0.05, false, 0.0, ""),
    row("4 flows, 1 ms jitter", 4, 0.0, true, 1.0, ""),
];

const fn row(
    label: &'static str,
    flows: usize,
    loss: f64,
    sack: bool,
    jitter_ms: f64,
    pair_rtts: &'static str,
) -> Row {
    Row {
        label,
        flows,
        loss,
        sack,
        jitter_ms,
        pair_rtts,
    }
}

const DIFFERENT_RTTS: Row = row(
    "4 flows, RTT 20/40/60/80 ms",
    4,
    0.0,
    true,
    0.0,
    "[20, 40, 60, 80]",
);

/// The evaluation's path with `row`'s flows and impairments, 30 s with 10 s of warm-up.
fn scenario(row: &Row) -> Scenario {
    let pair_rtts = if row.pair_rtts.is_empty() {
        String::new()
    } else {
        format!("pair_rtt_ms = {}\n", row.pair_rtts)
    };
    let text = format!(
        r#"
name = "{label}"
duration_ms = 30000
warmup_ms = 10000
window_rtts = 5
[topology]
kind = "dumbbell"
pairs = {flows}
bottleneck_mbps = 100
access_mbps = 1000
rtt_ms = 20
{pair_rtts}queue_packets = 250
impairments = {{ loss = {loss}, jitter_ms = {jitter} }}
[tcp]
sack = {sack}
recv_buffer = 4194304
send_buffer = 4194304
initial_rto_jitter_ms = 50
[[traffic]]
kind = "bulk"
flows = {flows}
start_jitter_ms = 100
"#,
        label = row.label,
        flows = row.flows,
        loss = row.loss,
        jitter = row.jitter_ms,
        sack = row.sack,
    );
    Scenario::from_toml(&text).expect("the evaluation's scenarios parse")
}

fn counter(report: &Report, name: &str) -> f64 {
    report.counters.get(name).copied().unwrap_or(0) as f64
}

/// Median and worst (lowest, or highest where `higher_is_worse`) over the seeds.
fn median_worst(values: &[f64], higher_is_worse: bool) -> (f64, f64) {
    let worst = if higher_is_worse {
        values.iter().copied().fold(f64::MIN, f64::max)
    } else {
        values.iter().copied().fold(f64::MAX, f64::min)
    };
    (median(values), worst)
}

/// The table's line for `row` over `reports`.
fn table_line(row: &Row, reports: &[Report]) -> String {
    let of = |f: &dyn Fn(&Report) -> f64| reports.iter().map(f).collect::<Vec<f64>>();
    let (g, gw) = median_worst(&of(&|r| r.aggregate_goodput_mbps), false);
    let (j, jw) = median_worst(&of(&|r| r.jain_index), false);
    let (x, xw) = median_worst(&of(&|r| r.network.retransmit_ratio * 100.0), true);
    let recoveries = median(&of(&|r| {
        counter(r, "TcpExt.TCPSackRecovery") + counter(r, "TcpExt.TCPRenoRecovery")
    }));
    let rtos = median(&of(&|r| counter(r, "TcpExt.TCPTimeouts")));
    let undos = median(&of(&|r| {
        counter(r, "TcpExt.TCPFullUndo") + counter(r, "TcpExt.TCPLossUndo")
    }));
    format!(
        "| {} | {g:.2} ({gw:.2}) | {j:.3} ({jw:.3}) | {x:.2} ({xw:.2}) | {recoveries:.0} | {rtos:.0} | {undos:.0} |",
        row.label
    )
}

/// Goodput of flow 0 per window (5 RTTs) over the run, in Mbit/s, with the window's end in s.
fn throughput_over_time(scenario: &Scenario, seed: u64) -> Vec<(f64, f64)> {
    let mut last = (0.0, 0u64);
    let mut series = Vec::new();
    run_observed(scenario, seed, |net| {
        let t = net.now().as_nanos() as f64 / 1e9;
        let delivered = net.ctx.flows.first().map_or(0, |f| f.delivered);
        if t > last.0 {
            let mbps = (delivered - last.1) as f64 * 8.0 / (t - last.0) / 1e6;
            series.push((t, mbps));
        }
        last = (t, delivered);
    });
    series
}

fn plot_lines(
    path: &Path,
    title: &str,
    x_label: &str,
    lines: &[(&str, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let x_max = lines
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.0))
        .fold(0.0, f64::max);
    let y_max = lines
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.1))
        .fold(0.0, f64::max)
        * 1.1;
    let root = SVGBackend::new(path, (800, 420)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0.0..x_max, 0.0..y_max.max(1.0))
        .map_err(|e| e.to_string())?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("goodput, Mbit/s")
        .draw()
        .map_err(|e| e.to_string())?;
    let colours = [BLUE, RED, GREEN, MAGENTA];
    for (i, (name, points)) in lines.iter().enumerate() {
        let colour = colours[i % colours.len()];
        chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                colour.stroke_width(2),
            ))
            .map_err(|e| e.to_string())?
            .label(*name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], colour));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| e.to_string())?;
    root.present().map_err(|e| e.to_string())
}

fn main() -> ExitCode {
    let mut seeds = 5u64;
    let mut write: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seeds" => match args.next().and_then(|v| v.parse().ok()) {
                Some(n) if n > 0 => seeds = n,
                _ => return usage("--seeds needs a positive integer"),
            },
            "--write" => match args.next() {
                Some(dir) => write = Some(dir),
                None => return usage("--write needs the docs directory"),
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => return usage(&format!("unknown argument {other}")),
        }
    }
    let mut table = String::from(
        "| row | goodput, Mbit/s | Jain | retransmitted/sent, % | recoveries | RTOs | undos |\n|---|---|---|---|---|---|---|\n",
    );
    for row in ROWS.iter().chain([&DIFFERENT_RTTS]) {
        let scenario = scenario(row);
        let reports: Vec<Report> = (1..=seeds).map(|seed| run(&scenario, seed)).collect();
        let _ = writeln!(table, "{}", table_line(row, &reports));
    }
    print!("{table}");
    let Some(dir) = write else {
        return ExitCode::SUCCESS;
    };
    match write_docs(Path::new(&dir), &table, seeds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("writing {dir}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// docs/evaluation.md and its plots.
fn write_docs(dir: &Path, table: &str, seeds: u64) -> Result<(), String> {
    let plots = dir.join("evaluation");
    std::fs::create_dir_all(&plots).map_err(|e| e.to_string())?;
    let one_percent = |sack| {
        scenario(&Row {
            sack,
            ..row("1 flow, 1 % loss", 1, 0.01, true, 0.0, "")
        })
    };
    plot_lines(
        &plots.join("throughput-over-time.svg"),
        "One flow, 100 Mbit/s, 20 ms, 1 % loss, seed 1: goodput per 5 RTTs",
        "time, s",
        &[
            ("SACK", throughput_over_time(&one_percent(true), 1)),
            ("no SACK", throughput_over_time(&one_percent(false), 1)),
        ],
    )?;
    let rates = [0.001, 0.005, 0.01, 0.02, 0.05];
    let by_loss = |sack: bool| -> Vec<(f64, f64)> {
        rates
            .iter()
            .map(|&loss| {
                let s = scenario(&Row {
                    loss,
                    sack,
                    ..row("", 1, 0.0, true, 0.0, "")
                });
                let g: Vec<f64> = (1..=seeds)
                    .map(|seed| run(&s, seed).aggregate_goodput_mbps)
                    .collect();
                (loss * 100.0, median(&g))
            })
            .collect()
    };
    let (with, without) = (by_loss(true), by_loss(false));
    plot_lines(
        &plots.join("sack-vs-no-sack.svg"),
        "One flow, 100 Mbit/s, 20 ms: median goodput against random loss",
        "loss, %",
        &[("SACK", with.clone()), ("no SACK", without.clone())],
    )?;
    let mut sack_table = String::from(
        "| loss | SACK, Mbit/s | no SACK, Mbit/s | SACK ÷ no SACK |\n|---|---|---|---|\n",
    );
    for ((loss, s), (_, n)) in with.iter().zip(&without) {
        let _ = writeln!(
            sack_table,
            "| {loss} % | {s:.2} | {n:.2} | {:.2} |",
            s / n.max(1e-9)
        );
    }
    let doc = format!(
        "# Evaluation\n\n\
         Generated by `cargo run -p userstack-sim --bin userstack-eval -- --seeds {seeds} --write docs`\n\
         (userstack-sim/src/bin/userstack-eval.rs); do not edit by hand.\n\n\
         ## In the simulator\n\n\
         A 100 Mbit/s bottleneck with 20 ms of base RTT and a 250-packet drop-tail queue, CUBIC with\n\
         Linux's defaults on both ends, 30 s per run of which the first 10 s are left out, seeds\n\
         1-{seeds}. Each cell is the median over the seeds and, in brackets, the worst seed (lowest\n\
         goodput or Jain, highest retransmitted/sent). Recoveries are fast recoveries entered\n\
         (TCPSackRecovery + TCPRenoRecovery), RTOs are TCPTimeouts, undos are TCPFullUndo +\n\
         TCPLossUndo, summed over both ends, medians over the seeds.\n\n\
         {table}\n\
         ![goodput over time, SACK and no SACK](evaluation/throughput-over-time.svg)\n\n\
         SACK against no SACK across random loss (one flow, medians over the seeds):\n\n\
         {sack_table}\n\
         ![goodput against loss](evaluation/sack-vs-no-sack.svg)\n\n\
         ## On real packets, beside Linux\n\n\
         Not measured yet: the same rows on the VM node's netem link, Linux TCP to Linux TCP and\n\
         userstack to Linux TCP in one boot, each row marked better, equal (within 2 %) or worse\n\
         than Linux (issue 22, item 4). Until then the table above is a simulator's figure, not a\n\
         comparison with Linux.\n"
    );
    std::fs::write(dir.join("evaluation.md"), doc).map_err(|e| e.to_string())
}

fn usage(problem: &str) -> ExitCode {
    eprintln!("{problem}\n{USAGE}");
    ExitCode::from(2)
}
