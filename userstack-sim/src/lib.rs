//! userstack-sim: a deterministic discrete-event network simulator, the laboratory that
//! judges the user-space TCP engine (crate `userstack`). Same scenario and seed, same run,
//! bit for bit. [`scenario`] is the TOML experiment format, [`run`] runs one with a seed and
//! returns its [`metrics::Report`]; the binary `userstack-sim` prints reports as JSON.

#![warn(missing_docs)]

pub mod frame_pool;
pub mod link;
pub mod metrics;
pub mod network;
pub mod queue;
pub mod rng;
pub mod scenario;
pub mod soak;
pub mod traffic;

use core::time::Duration;
use link::{LinkConfig, LinkDirection};
use metrics::{jain_index, percentile, FlowReport, Report, ShortFlowReport, TracePoint};
use network::{Network, Node};
use scenario::{Impairments, Scenario, TopologyKind, Traffic};
use std::net::{Ipv4Addr, SocketAddrV4};
use traffic::{App, FlowProgress, Pattern};
use userstack::stack::{Stack, StackConfig};
use userstack::time::Instant;
use userstack::wire::EthernetAddress;

/// Port of the first long-lived flow's receiver; flow `f` uses `FLOW_PORT_BASE + f`.
const FLOW_PORT_BASE: u16 = 5001;
/// Port of the short-connection receiver.
const SHORT_PORT: u16 = 9000;

fn host_mac(index: usize) -> EthernetAddress {
    EthernetAddress([2, 0, 0, 0, (index >> 8) as u8, index as u8])
}

fn host_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(198, 18, (index / 250) as u8, (index % 250 + 1) as u8)
}

fn impaired(mut link: LinkConfig, impairments: &Impairments) -> LinkConfig {
    link.loss = impairments.loss;
    link.burst_loss = impairments.burst_loss;
    link.jitter = Duration::from_secs_f64(impairments.jitter_ms / 1000.0);
    link.reorder = impairments.reorder;
    link.reorder_delay = Duration::from_secs_f64(impairments.reorder_ms / 1000.0);
    link.duplicate = impairments.duplicate;
    link
}

/// The built network plus which hosts send and receive.
struct Built {
    network: Network,
    senders: Vec<usize>,
    receivers: Vec<usize>,
}

fn build(scenario: &Scenario, seed: u64) -> Built {
    let topo = &scenario.topology;
    let mut network = Network::new(seed);
    let tcp = scenario.tcp.apply();
    let new_stack = |index: usize| {
        let mut config = StackConfig::new(host_mac(index), host_ip(index), 15);
        config.tcp = tcp;
        config.secret = seed.wrapping_mul(0x9e37_79b9).wrapping_add(index as u64);
        config.rx_checksum_offload = !scenario.checksums;
        config.tx_checksum_offload = !scenario.checksums;
        Stack::new(config, Instant::ZERO)
    };
    let one_way = Duration::from_secs_f64(topo.rtt_ms / 2000.0);
    let bottleneck = LinkConfig::clean(topo.bottleneck_mbps, one_way, topo.queue_packets);
    let forward = impaired(bottleneck, &topo.impairments);
    let reverse = if topo.impair_reverse {
        forward
    } else {
        bottleneck
    };
    match topo.kind {
        TopologyKind::Loopback => {
            let host = network.add_host(new_stack(0));
            network.add_link(host, host, 0, LinkDirection::new(forward));
            Built {
                network,
                senders: vec![host],
                receivers: vec![host],
            }
        }
        TopologyKind::Pair => {
            let a = network.add_host(new_stack(0));
            let b = network.add_host(new_stack(1));
            network.add_link(a, b, 0, LinkDirection::new(forward));
            network.add_link(b, a, 0, LinkDirection::new(reverse));
            Built {
                network,
                senders: vec![a],
                receivers: vec![b],
            }
        }
        TopologyKind::Dumbbell => {
            let n = topo.pairs.max(1);
            let access = LinkConfig::clean(topo.access_mbps, Duration::ZERO, 10_000);
            let senders: Vec<usize> = (0..n).map(|i| network.add_host(new_stack(i))).collect();
            let receivers: Vec<usize> =
                (0..n).map(|i| network.add_host(new_stack(n + i))).collect();
            let left = network.add_gateway();
            let right = network.add_gateway();
            for (i, &s) in senders.iter().enumerate() {
                // A pair's longer RTT is propagation delay on its sender's access link.
                let extra_ms = topo.pair_rtt_ms.get(i).map_or(0.0, |r| r - topo.rtt_ms);
                let delayed = LinkConfig {
                    delay: Duration::from_secs_f64(extra_ms.max(0.0) / 2000.0),
                    ..access
                };
                network.add_link(s, left, i, LinkDirection::new(delayed));
                network.add_link(left, s, 0, LinkDirection::new(delayed));
            }
            for (i, &r) in receivers.iter().enumerate() {
                network.add_link(r, right, i, LinkDirection::new(access));
                network.add_link(right, r, 0, LinkDirection::new(access));
            }
            network.add_link(left, right, n, LinkDirection::new(forward));
            network.add_link(right, left, n, LinkDirection::new(reverse));
            for i in 0..n {
                if let Node::Gateway(g) = network.node_mut(left) {
                    g.table.insert(host_mac(i), i);
                    g.table.insert(host_mac(n + i), n);
                }
                if let Node::Gateway(g) = network.node_mut(right) {
                    g.table.insert(host_mac(n + i), i);
                    g.table.insert(host_mac(i), n);
                }
            }
            Built {
                network,
                senders,
                receivers,
            }
        }
    }
}

fn host_apps(network: &mut Network, node: usize) -> &mut Vec<App> {
    match network.node_mut(node) {
        Node::Host(host) => &mut host.apps,
        Node::Gateway(_) => unreachable!("traffic runs on hosts"),
    }
}

fn host_index_ip(network: &Network, node: usize) -> Ipv4Addr {
    network.stack(node).map(|s| s.config().ip).expect("host")
}

/// Runs `scenario` with `seed` and reports what it measured.
pub fn run(scenario: &Scenario, seed: u64) -> Report {
    run_observed(scenario, seed, |_| {})
}

/// [`run`], showing the network to `observe` at every metrics sample (each `window_rtts`
/// base RTTs of simulated time).
pub fn run_observed(scenario: &Scenario, seed: u64, mut observe: impl FnMut(&Network)) -> Report {
    let Built {
        mut network,
        senders,
        receivers,
    } = build(scenario, seed);
    let tcp = scenario.tcp.apply();
    let mut flow = 0usize;
    let mut setup_rng = rng::Rng::new(seed ^ 0x7472_6166_6669_6300);
    for traffic in &scenario.traffic {
        let (count, pattern, start, jitter_ms) = match *traffic {
            Traffic::Bulk {
                flows,
                bytes,
                start_ms,
                start_jitter_ms,
            } => (
                flows,
                Pattern::Bulk { limit: bytes },
                Instant::from_millis(start_ms),
                start_jitter_ms,
            ),
            Traffic::Cbr {
                flows,
                rate_mbps,
                write_bytes,
            } => {
                let interval =
                    Duration::from_secs_f64(write_bytes as f64 * 8.0 / (rate_mbps * 1e6));
                (
                    flows,
                    Pattern::Cbr {
                        write_bytes,
                        interval,
                    },
                    Instant::ZERO,
                    0,
                )
            }
            Traffic::OnOff {
                flows,
                on_ms,
                off_ms,
            } => {
                let on = Duration::from_millis(on_ms);
                let off = Duration::from_millis(off_ms);
                (flows, Pattern::OnOff { on, off }, Instant::ZERO, 0)
            }
            Traffic::Short {
                per_second,
                bytes,
                hold_ms,
                until_ms,
            } => {
                let sender = senders[0];
                let receiver = receivers[0];
                let remote = SocketAddrV4::new(host_index_ip(&network, receiver), SHORT_PORT);
                if let Node::Host(host) = network.node_mut(receiver) {
                    let _ = host.stack.listen_with(SHORT_PORT, 4096, tcp);
                }
                host_apps(&mut network, receiver).push(App::ShortReceiver { port: SHORT_PORT });
                host_apps(&mut network, sender).push(App::ShortSender {
                    remote,
                    interval: Duration::from_secs_f64(1.0 / per_second.max(1e-3)),
                    bytes,
                    hold: Duration::from_millis(hold_ms),
                    until: until_ms.map(Instant::from_millis),
                    next_open: Instant::ZERO,
                    active: Vec::new(),
                    held: Default::default(),
                });
                continue;
            }
        };
        for _ in 0..count {
            let sender = senders[flow % senders.len()];
            let receiver = receivers[flow % receivers.len()];
            let port = FLOW_PORT_BASE + flow as u16;
            if let Node::Host(host) = network.node_mut(receiver) {
                let _ = host.stack.listen_with(port, 128, tcp);
            }
            let remote = SocketAddrV4::new(host_index_ip(&network, receiver), port);
            let start = start + Duration::from_micros(setup_rng.below(jitter_ms * 1000 + 1));
            network.ctx.flows.push(FlowProgress::default());
            host_apps(&mut network, receiver).push(App::Receiver {
                flow,
                port,
                handles: Vec::new(),
            });
            host_apps(&mut network, sender).push(App::Sender {
                flow,
                host: sender,
                remote,
                pattern,
                start,
                handle: None,
                written: 0,
                next_write: start,
            });
            flow += 1;
        }
    }

    let base_rtt = Duration::from_secs_f64(scenario.topology.rtt_ms / 1000.0);
    let window = (base_rtt * scenario.window_rtts.max(1)).max(Duration::from_millis(1));
    let warmup = Instant::from_millis(scenario.warmup_ms);
    let end = Instant::from_millis(scenario.duration_ms);
    let flows = network.ctx.flows.len();
    let mut last_delivered = vec![0u64; flows];
    let mut at_warmup = vec![0u64; flows];
    let mut measured_from = Instant::ZERO;
    let mut samples: Vec<Vec<f64>> = vec![Vec::new(); flows];
    let mut traces = Vec::new();
    let want_traces = scenario.traces;
    network.wake_all();
    network.sample_every(window);
    network.run_until(end, |net| {
        observe(net);
        let now = net.now();
        for f in 0..flows {
            let progress = net.ctx.flows[f];
            if now <= warmup {
                at_warmup[f] = progress.delivered;
                measured_from = now;
            } else {
                let bits = (progress.delivered - last_delivered[f]) as f64 * 8.0;
                samples[f].push(bits / window.as_secs_f64() / 1e6);
            }
            last_delivered[f] = progress.delivered;
            if want_traces {
                if let Some(conn) = progress
                    .sender
                    .and_then(|(host, h)| net.stack(host)?.connection(h))
                {
                    traces.push(TracePoint {
                        flow: f,
                        t_ms: now.as_nanos() as f64 / 1e6,
                        cwnd: conn.cwnd(),
                        ssthresh: conn.ssthresh(),
                        rwnd: conn.snd_wnd(),
                        srtt_ms: conn.srtt().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
                    });
                }
            }
        }
    });

    let measured = (end - measured_from).as_secs_f64().max(1e-9);
    let mut flow_reports = Vec::new();
    let mut data_sent = 0;
    for (f, series) in samples.iter().enumerate() {
        let progress = network.ctx.flows[f];
        let stats = progress
            .sender
            .and_then(|(host, h)| network.stack(host)?.connection(h))
            .map(|c| *c.stats())
            .unwrap_or_default();
        data_sent += stats.data_segments_sent;
        flow_reports.push(FlowReport {
            flow: f,
            goodput_mbps: (progress.delivered - at_warmup[f]) as f64 * 8.0 / measured / 1e6,
            p50_mbps: percentile(series, 50.0),
            p95_mbps: percentile(series, 95.0),
            p99_mbps: percentile(series, 99.0),
            bytes_delivered: progress.delivered,
            data_segments_sent: stats.data_segments_sent,
            retransmissions: stats.retransmissions,
            spurious_retransmissions: stats.spurious_retransmissions,
        });
    }
    let mut net = network.stats.clone();
    let retransmitted: u64 = senders
        .iter()
        .chain(receivers.iter())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter_map(|&n| network.stack(n))
        .map(|s| s.counters().get(userstack::counters::Counter::RetransSegs))
        .sum();
    net.retransmitted_segments = retransmitted;
    net.loss_ratio =
        (net.queue_drops + net.wire_losses) as f64 / (net.frames_offered.max(1)) as f64;
    net.retransmit_ratio = retransmitted as f64 / data_sent.max(1) as f64;
    net.retransmissions_per_loss = retransmitted as f64 / net.data_segments_lost.max(1) as f64;
    let mut counters = std::collections::BTreeMap::new();
    let hosts: std::collections::BTreeSet<usize> =
        senders.iter().chain(receivers.iter()).copied().collect();
    for &n in &hosts {
        if let Some(stack) = network.stack(n) {
            for (proto, field, value) in stack.counters().fields() {
                if value > 0 && proto.starts_with("Tcp") {
                    *counters.entry(format!("{proto}.{field}")).or_insert(0) += value;
                }
            }
        }
    }
    let goodputs: Vec<f64> = flow_reports.iter().map(|f| f.goodput_mbps).collect();
    let aggregate: f64 = goodputs.iter().sum();
    let fct = &network.ctx.short_fct_ms;
    Report {
        scenario: scenario.name.clone(),
        seed,
        link_mbps: scenario.topology.bottleneck_mbps,
        base_rtt_ms: scenario.topology.rtt_ms,
        aggregate_goodput_mbps: aggregate,
        link_share: aggregate / scenario.topology.bottleneck_mbps,
        utilization: aggregate / max_goodput_mbps(scenario),
        jain_index: jain_index(&goodputs),
        flows: flow_reports,
        network: net,
        short_flows: ShortFlowReport {
            started: network.ctx.short_started,
            completed: fct.len() as u64,
            fct_p50_ms: percentile(fct, 50.0),
            fct_p95_ms: percentile(fct, 95.0),
            fct_p99_ms: percentile(fct, 99.0),
        },
        simulated_packets: network.packets(),
        counters,
        traces,
        trace_digest: format!("{:016x}", network.digest()),
    }
}

/// The best goodput the bottleneck allows: full-sized segments (payload = MSS minus the
/// timestamp option) over their size on the wire (Ethernet, IPv4, TCP headers, plus preamble,
/// FCS and inter-frame gap, 24 bytes).
pub fn max_goodput_mbps(scenario: &Scenario) -> f64 {
    let tcp = scenario.tcp.apply();
    let options = if tcp.timestamps { 12.0 } else { 0.0 };
    let payload = f64::from(tcp.mss) - options;
    let wire = f64::from(tcp.mss) + 40.0 + 14.0 + 24.0;
    scenario.topology.bottleneck_mbps * payload / wire
}

/// The median of `values` (for medians over seeds).
pub fn median(values: &[f64]) -> f64 {
    percentile(values, 50.0)
}
