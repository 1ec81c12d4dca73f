//! docs/evaluation.md and its plots, from the simulator's runs and the real link's
//! measurements.

use crate::report::{counter, Mark, Measurement, Pairing, Shortfall, Summary};
use crate::rows::{Row, ROWS};
use crate::sim;
use crate::spread;
use hoststack_runner_api::{IdlePolicy, RxWait};
use plotters::prelude::*;
use std::fmt::Write as _;
use std::path::Path;
use userstack_sim::median;
use userstack_sim::metrics::Report;

/// Every row run in the simulator over seeds `1..=seeds`.
pub fn simulate(seeds: u64) -> Vec<(&'static Row, Vec<Report>)> {
    ROWS.iter()
        .map(|row| (row, sim::runs(row, seeds)))
        .collect()
}

/// The simulator's table: each cell the median over the seeds and, in brackets, the worst.
pub fn sim_table(runs: &[(&Row, Vec<Report>)]) -> String {
    let mut table = String::from(
        "| row | goodput, Mbit/s | Jain | retransmitted/sent, % | recoveries | RTOs | undos |\n\
         |---|---|---|---|---|---|---|\n",
    );
    for (row, reports) in runs {
        let of = |f: &dyn Fn(&Report) -> f64| reports.iter().map(f).collect::<Vec<f64>>();
        let (g, gw) = sim::median_worst(&of(&|r| r.aggregate_goodput_mbps), false);
        let (j, jw) = sim::median_worst(&of(&|r| r.jain_index), false);
        let (x, xw) = sim::median_worst(&of(&|r| r.network.retransmit_ratio * 100.0), true);
        let recoveries = median(&of(&|r| {
            sim::counter(r, "TcpExt.TCPSackRecovery") + sim::counter(r, "TcpExt.TCPRenoRecovery")
        }));
        let rtos = median(&of(&|r| sim::counter(r, "TcpExt.TCPTimeouts")));
        let undos = median(&of(&|r| {
            sim::counter(r, "TcpExt.TCPFullUndo") + sim::counter(r, "TcpExt.TCPLossUndo")
        }));
        let _ = writeln!(
            table,
            "| {} | {g:.2} ({gw:.2}) | {j:.3} ({jw:.3}) | {x:.2} ({xw:.2}) | {recoveries:.0} | {rtos:.0} | {undos:.0} |",
            row.label
        );
    }
    table
}

/// The runs of `row` with `pairing`; `control`: those with a core kept busy (`--spin-core`),
/// else those without. Runs whose runner never slept (`--runner-idle spin`) are an
/// experiment beside the tables, not part of them.
fn runs_of<'a>(
    measurements: &'a [Measurement],
    row: &Row,
    pairing: Pairing,
    control: bool,
) -> Vec<&'a Measurement> {
    measurements
        .iter()
        .filter(|m| m.row == row.label && m.pairing == pairing)
        .filter(|m| m.spin_core.is_some() == control)
        .filter(|m| m.runner_idle == IdlePolicy::Park)
        .collect()
}

/// A table's lines: the three pairings, and Linux → Linux with the runner's core kept busy
/// (the control), each with its name.
const LINES: [(Pairing, bool, &str); 4] = [
    (Pairing::LinuxToLinux, false, "Linux → Linux"),
    (
        Pairing::LinuxToLinux,
        true,
        "Linux → Linux, runner's vCPU taken",
    ),
    (Pairing::UserstackToLinux, false, "userstack → Linux"),
    (Pairing::LinuxToUserstack, false, "Linux → userstack"),
];

/// `userstack`'s mark against `linux`; a worse one names each figure that falls short, with
/// the p-value of its runs against Linux's ([`spread::mann_whitney_p`]: how often runs split
/// at random between the two lines differ as much) when both lines have several runs.
fn judged(
    userstack: &Summary,
    linux: &Summary,
    ours: &[&Measurement],
    theirs: &[&Measurement],
) -> String {
    let mark = Mark::of(userstack, linux);
    if mark != Mark::Worse {
        return mark.as_str().to_string();
    }
    let figures = |runs: &[&Measurement], what: Shortfall| -> Vec<f64> {
        runs.iter().map(|m| what.figure(m)).collect()
    };
    let several = ours.len() > 1 && theirs.len() > 1;
    let shortfalls: Vec<String> = Shortfall::of(userstack, linux)
        .into_iter()
        .map(|what| {
            let p = spread::mann_whitney_p(&figures(ours, what), &figures(theirs, what));
            match p.filter(|_| several) {
                Some(p) => format!("{} p {p:.2}", what.as_str()),
                None => what.as_str().to_string(),
            }
        })
        .collect();
    format!("{}: {}", mark.as_str(), shortfalls.join(", "))
}

/// A median, with the lowest run in brackets when there were several.
fn with_lowest(median: f64, lowest: f64, runs: usize, digits: usize) -> String {
    if runs > 1 {
        format!("{median:.digits$} ({lowest:.digits$})")
    } else {
        format!("{median:.digits$}")
    }
}

/// The real link's table: per row, one line per pairing (medians over its runs, the lowest
/// goodput and Jain in brackets when there were several), userstack's lines marked against
/// Linux → Linux on the same row and, where it was measured, against the control (Linux →
/// Linux with the runner's vCPU kept busy), and the simulator's median goodput beside them.
pub fn link_table(measurements: &[Measurement], runs: &[(&Row, Vec<Report>)]) -> String {
    let mut table = String::from(
        "| row | sender → receiver | runs | goodput, Mbit/s | Jain | retransmitted/sent, % | recoveries | RTOs | undos | against Linux → Linux | against the control | simulator, Mbit/s |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (row, reports) in runs {
        let reference = Summary::of(&runs_of(measurements, row, Pairing::LinuxToLinux, false));
        let control = Summary::of(&runs_of(measurements, row, Pairing::LinuxToLinux, true));
        let simulated = median(
            &reports
                .iter()
                .map(|r| r.aggregate_goodput_mbps)
                .collect::<Vec<_>>(),
        );
        for (pairing, is_control, name) in LINES {
            let Some(m) = Summary::of(&runs_of(measurements, row, pairing, is_control)) else {
                continue;
            };
            let ours = runs_of(measurements, row, pairing, is_control);
            let against = |reference: &Option<Summary>, theirs: bool| match reference {
                Some(linux) => judged(
                    &m,
                    linux,
                    &ours,
                    &runs_of(measurements, row, Pairing::LinuxToLinux, theirs),
                ),
                None => "—".to_string(),
            };
            let (mark, against_control) = match (pairing, is_control) {
                (Pairing::LinuxToLinux, false) => ("reference".to_string(), String::new()),
                (Pairing::LinuxToLinux, true) => (String::new(), "control".to_string()),
                _ if control.is_some() => (against(&reference, false), against(&control, true)),
                _ => (against(&reference, false), String::new()),
            };
            let sim_cell = if pairing == Pairing::UserstackToLinux {
                format!("{simulated:.2}")
            } else {
                String::new()
            };
            let _ = writeln!(
                table,
                "| {} | {name} | {} | {} | {} | {:.2} | {:.0} | {:.0} | {:.0} | {mark} | {against_control} | {sim_cell} |",
                row.label,
                m.runs,
                with_lowest(m.goodput_mbps, m.lowest_goodput_mbps, m.runs, 2),
                with_lowest(m.jain, m.lowest_jain, m.runs, 3),
                m.retransmitted_per_sent * 100.0,
                m.recoveries,
                m.rtos,
                m.undos,
            );
        }
    }
    table
}

/// Where the time went on the real link, per row and pairing (medians over the runs that
/// recorded it): each vCPU's busy and softirq shares, how much of the Linux sender's time the
/// receiver's window held it back, the runner's busy share and the frames its queue lost, the
/// path's drops, how many segments the receiver took per segment (ACK) it sent, the Linux
/// sender's smoothed RTT and the ping beside it, and how long the runner's received frames
/// waited between its XDP program and its loop (with a note below the table where a runner
/// had no receive stamps, and why).
pub fn load_table(measurements: &[Measurement]) -> String {
    let mut table = String::from(
        "| row | sender → receiver | vCPU busy, % | vCPU softirq, % | Linux sender held by the receive window, % | runner busy, % | frames lost at the runner's queue | data packets lost on the path (netem) | data packets dropped by the full bottleneck queue (tbf) | segments received per ACK sent | Linux sender's smoothed RTT, ms | ping to the receiver, ms | frames' wait at the runner, mean µs | 90 % of frames waited under, µs |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for row in ROWS.iter() {
        for (pairing, control, name) in LINES {
            let runs: Vec<&Measurement> = runs_of(measurements, row, pairing, control)
                .into_iter()
                .filter(|m| !m.load.cpu_busy.is_empty())
                .collect();
            if runs.is_empty() {
                continue;
            }
            let per_cpu = |f: &dyn Fn(&Measurement) -> &Vec<f64>| {
                let cpus = runs.iter().map(|m| f(m).len()).min().unwrap_or(0);
                (0..cpus)
                    .map(|c| {
                        let shares: Vec<f64> = runs.iter().map(|m| f(m)[c] * 100.0).collect();
                        format!("{:.0}", median(&shares))
                    })
                    .collect::<Vec<_>>()
                    .join(" / ")
            };
            let optional = |f: &dyn Fn(&Measurement) -> Option<f64>, digits: usize| {
                let values: Vec<f64> = runs.iter().filter_map(|m| f(m)).collect();
                if values.is_empty() {
                    "—".to_string()
                } else {
                    format!("{:.digits$}", median(&values))
                }
            };
            let _ = writeln!(
                table,
                "| {} | {name} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                row.label,
                per_cpu(&|m| &m.load.cpu_busy),
                per_cpu(&|m| &m.load.cpu_softirq),
                optional(&|m| m.load.rwnd_limited.map(|s| s * 100.0), 1),
                optional(&|m| m.load.runner_busy.map(|s| s * 100.0), 1),
                optional(&|m| m.load.runner_drops.map(|d| d.lost() as f64), 0),
                optional(&|m| m.load.path_losses.map(|n| n as f64), 0),
                optional(&|m| m.load.queue_drops.map(|n| n as f64), 0),
                optional(
                    &|m| {
                        let acks = counter(&m.receiver, "Tcp", "OutSegs");
                        (acks > 0)
                            .then(|| counter(&m.receiver, "Tcp", "InSegs") as f64 / acks as f64)
                    },
                    1
                ),
                optional(&|m| m.load.sender_rtt_ms, 1),
                optional(&|m| m.load.ping_rtt_ms, 1),
                optional(
                    &|m| m.load.runner_rx_wait.as_ref().and_then(RxWait::mean_micros),
                    0
                ),
                optional(
                    &|m| {
                        let wait = m.load.runner_rx_wait.as_ref()?;
                        wait.quantile_bound_micros(0.9).map(|b| b as f64)
                    },
                    0
                ),
            );
        }
    }
    let unstamped: std::collections::BTreeSet<&str> = measurements
        .iter()
        .filter_map(|m| m.load.runner_rx_stamps_unavailable.as_deref())
        .collect();
    for reason in unstamped {
        let _ = writeln!(
            table,
            "\nThe frames' wait is empty (—) for runs whose runner had no receive stamps: {reason}."
        );
    }
    table
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

/// The real link's section: its table, or why there is none.
fn link_section(link: Option<&[Measurement]>, runs: &[(&Row, Vec<Report>)]) -> String {
    let Some(measurements) = link else {
        return "Not measured in this run: `hoststack-lab evaluate` runs the rows on the VM \
                node's netem link; `userstack-eval docs` without `--link` writes the \
                simulator's half only.\n"
            .into();
    };
    let seconds = measurements.first().map_or(0.0, |m| m.seconds);
    format!(
        "Measured by `hoststack-lab evaluate` (`e2e/src/evaluation.rs`, `userstack-eval link` in the\n\
         guest; docs/userstack.md reads the table). The VM node's guest (Debian's 6.1 kernel under\n\
         qemu/TCG, 2 vCPUs) builds the same path\n\
         out of three network namespaces: sender, router and receiver, joined by veth pairs\n\
         (`userstack-eval/src/link/topology.rs`). The router's data direction is netem (10 ms,\n\
         the row's loss and jitter) feeding tbf (100 Mbit/s, a 378,500-byte queue: 250\n\
         full-size frames); its ACK direction is netem (the rest of each flow's RTT, by\n\
         receiving port). Offloads (TSO, GSO, GRO) are off on every veth, so a loss or a queue\n\
         slot is one wire-sized packet for both stacks, and in steered runs (the default) every\n\
         veth's RPS mask leaves the runner's vCPU out, in every pairing: the kernel's packet work\n\
         (veth, netem, tbf, the XDP program and AF_XDP copy) stays off that vCPU, as the agent\n\
         keeps it off a user-space stack's dedicated core. Linux is the guest's own TCP (CUBIC,\n\
         `tcp_no_metrics_save=1`, the row's `tcp_sack` on both ends); userstack is the runner\n\
         `hoststack-userstack` with AF_XDP (copy mode) on its end's veth, pinned to vCPU 1,\n\
         sending with its bulk clients or receiving with its discard service. Each run has a\n\
         fresh link and measures {seconds:.0} s after the warm-up; the rounds interleave the\n\
         rows and pairings, and each line gives the median over its runs by nearest rank (the\n\
         lower of two; the lowest goodput and Jain in brackets when there were several). Goodput is what the\n\
         Linux receiver read or, when userstack receives, what the Linux sender saw acknowledged\n\
         (`tcpi_bytes_acked`); the counters are the sender's, moved over the window: recoveries\n\
         are TCPSackRecovery + TCPRenoRecovery, RTOs TCPTimeouts, undos TCPFullUndo +\n\
         TCPLossUndo. A userstack line is **better** with goodput more than 2 % above\n\
         Linux → Linux on the same row, **equal** within 2 % (Jain too, retransmitted/sent\n\
         at most 0.2 points above), **worse** otherwise; a worse mark names each figure that\n\
         falls short, with its p-value where both lines have several runs: the exact\n\
         two-sided Mann-Whitney test of the line's runs\n\
         against Linux's, the share of all splits of the pooled runs between the two lines whose\n\
         rank sums lie as far apart (with three runs a side it cannot fall below 0.10; a large p\n\
         says the runs cannot tell the lines apart, not that they are the same). The guest has two vCPUs and the runner\n\
         busy-polls one of them, so a userstack pairing leaves Linux's end, the router and the\n\
         kernel's packet work one vCPU where Linux → Linux has two: the control, Linux → Linux\n\
         with a thread spinning on the runner's vCPU (`--spin-core 1`), gives Linux the same\n\
         CPUs, and userstack's lines are marked against it too. The simulator column is the median\n\
         goodput of the same row in the simulator (userstack on both ends), to validate it\n\
         against the real link.\n\n\
         What differs between the stacks: userstack busy-polls its vCPU while Linux sleeps in\n\
         its socket calls, and its frames go through AF_XDP copy mode on the veth (a copy and a\n\
         system call per batch) where Linux's go through the veth directly.\n\n{}\n\
         Where the time went in the same runs (medians): each vCPU's share of the window busy\n\
         and in softirq (`/proc/stat`; vCPU 1 is the runner's, which busy-polls), the share of\n\
         the Linux sender's sending time that the receiver's window held it back\n\
         (`tcpi_rwnd_limited` ÷ `tcpi_busy_time` over its connections), the share of the\n\
         runner's loop in turns that did something, the frames its AF_XDP queue lost (rx\n\
         dropped or ring full, tx ring full), and the router's own count of the data packets\n\
         its netem dropped (the row's random loss) and its tbf dropped (the bottleneck queue\n\
         full): what the senders' retransmissions answer. The last column is the receiver's\n\
         segments received per segment sent, in a one-way transfer its data segments per ACK:\n\
         the sender's ACK clock; when Linux sends, its connections' smoothed RTT (`tcpi_rtt`,\n\
         averaged over a look every second): the path's 20 ms, the queue's delay and the\n\
         receiver's ACK delay, which the sender's window growth runs on; and the mean round\n\
         trip of pings from the sender's namespace to the receiver in the same window (five a\n\
         second): the same path, queue and receiving host with no TCP in it. The last two\n\
         columns are how long the frames the runner received waited between its XDP program,\n\
         which stamps each with the kernel's clock, and its loop taking them off the AF_XDP\n\
         ring (the veth publishes a poll's redirected frames at the poll's end; the loop may\n\
         be parked or busy): the mean, and the power of two in microseconds under which 90 %\n\
         of them waited; — for runs made before the runner reported it, or whose runner had\n\
         no receive stamps (its kernel refused the helper; a note below the table says why).\n\n{}",
        link_table(measurements, runs),
        load_table(measurements),
    )
}

/// Writes `dir/evaluation.md` and its plots from the simulator (seeds `1..=seeds`) and, when
/// given, the real link's measurements; `how` (Markdown) says which command regenerates it.
pub fn write(
    dir: &Path,
    seeds: u64,
    link: Option<&[Measurement]>,
    how: &str,
) -> Result<(), String> {
    let plots = dir.join("evaluation");
    std::fs::create_dir_all(&plots).map_err(|e| e.to_string())?;
    let runs = simulate(seeds);
    let one_percent = |sack| {
        sim::scenario(&Row {
            sack,
            ..*crate::rows::by_label("1 flow, 1 % loss").expect("the row exists")
        })
    };
    plot_lines(
        &plots.join("throughput-over-time.svg"),
        "One flow, 100 Mbit/s, 20 ms, 1 % loss, seed 1: goodput per 5 RTTs",
        "time, s",
        &[
            ("SACK", sim::throughput_over_time(&one_percent(true), 1)),
            ("no SACK", sim::throughput_over_time(&one_percent(false), 1)),
        ],
    )?;
    let rates = [0.001, 0.005, 0.01, 0.02, 0.05];
    let one_flow = *crate::rows::by_label("1 flow").expect("the row exists");
    let by_loss = |sack: bool| -> Vec<(f64, f64)> {
        rates
            .iter()
            .map(|&loss| {
                let reports = sim::runs(
                    &Row {
                        loss,
                        sack,
                        ..one_flow
                    },
                    seeds,
                );
                let g: Vec<f64> = reports.iter().map(|r| r.aggregate_goodput_mbps).collect();
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
         Generated by {how}; do not edit by hand. The rows are\n\
         `userstack-eval/src/rows.rs`: a 100 Mbit/s bottleneck with 20 ms of base RTT and a\n\
         250-packet drop-tail queue, and the flows and impairments of each row.\n\n\
         ## On real packets, beside Linux\n\n\
         {link}\n\
         ## In the simulator\n\n\
         CUBIC with Linux's defaults on both ends, 30 s per run of which the first 10 s are\n\
         left out, seeds 1-{seeds}. Each cell is the median over the seeds and, in brackets, the\n\
         worst seed (lowest goodput or Jain, highest retransmitted/sent). Recoveries are fast\n\
         recoveries entered (TCPSackRecovery + TCPRenoRecovery), RTOs are TCPTimeouts, undos are\n\
         TCPFullUndo + TCPLossUndo, summed over both ends, medians over the seeds.\n\n\
         {sim}\n\
         ![goodput over time, SACK and no SACK](evaluation/throughput-over-time.svg)\n\n\
         SACK against no SACK across random loss (one flow, medians over the seeds):\n\n\
         {sack_table}\n\
         ![goodput against loss](evaluation/sack-vs-no-sack.svg)\n",
        link = link_section(link, &runs),
        sim = sim_table(&runs),
    );
    std::fs::write(dir.join("evaluation.md"), doc).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::measured;

    #[test]
    fn a_run_without_receive_stamps_leaves_the_wait_empty_and_says_why() {
        let reason = "the kernel refuses bpf_xdp_adjust_meta to XDP programs (verifier: \
                      program of this type cannot use helper bpf_xdp_adjust_meta#54)";
        let mut m = measured(&[20.0], 10, 10_000);
        m.row = ROWS[0].label.to_string();
        m.pairing = Pairing::LinuxToUserstack;
        m.load.cpu_busy = vec![0.5, 1.0];
        m.load.runner_rx_stamps_unavailable = Some(reason.into());
        let table = load_table(&[m.clone(), m]);
        let line = table
            .lines()
            .find(|l| l.contains("| Linux → userstack |"))
            .unwrap_or_else(|| panic!("no line in {table}"));
        assert!(line.ends_with("| — | — |"), "{line}");
        // Said once, however many runs lacked stamps.
        let note = format!(
            "The frames' wait is empty (—) for runs whose runner had no receive stamps: {reason}."
        );
        assert_eq!(table.matches(&note).count(), 1, "{table}");
    }

    #[test]
    fn a_worse_line_names_what_falls_short_with_its_p_value() {
        let linux: Vec<Measurement> = [60.0, 62.0, 64.0]
            .iter()
            .map(|&g| measured(&[g / 2.0, g / 2.0], 10, 10_000))
            .collect();
        let linux: Vec<&Measurement> = linux.iter().collect();
        let judge = |goodputs: &[f64]| {
            let ours: Vec<Measurement> = goodputs
                .iter()
                .map(|&g| measured(&[g / 2.0, g / 2.0], 10, 10_000))
                .collect();
            let ours: Vec<&Measurement> = ours.iter().collect();
            judged(
                &Summary::of(&ours).unwrap(),
                &Summary::of(&linux).unwrap(),
                &ours,
                &linux,
            )
        };
        // Every run below every one of Linux's: 2 of the 20 splits are as far apart.
        assert_eq!(judge(&[50.0, 52.0, 54.0]), "worse: goodput p 0.10");
        // The median 5 % below, but the runs interleave with Linux's: 6 of 20 splits.
        assert_eq!(judge(&[59.0, 59.0, 63.0]), "worse: goodput p 0.30");
        assert_eq!(judge(&[61.5, 62.0, 64.0]), "equal");
        // One run cannot be set against Linux's spread: the figure alone.
        assert_eq!(judge(&[50.0]), "worse: goodput");
    }
}
