//! Resident memory stays flat over a long series of scrapes of the real /proc: the parse
//! buffers are kept between scrapes and nothing accumulates. Alone in its test binary, so no
//! other test's allocations show in VmRSS. (The e2e metrics test does the same against a
//! running agent over HTTP.)

use std::path::Path;

use hoststack_agent::exporter::{Exporter, Format};

fn vm_rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

#[test]
fn rss_is_flat_over_2000_scrapes() {
    let exporter = Exporter::new(Path::new("/proc"));
    let mut bytes = 0;
    for _ in 0..200 {
        bytes += exporter.encode().len();
    }
    let warm = vm_rss_kib();
    for i in 0..2000 {
        let format = if i % 2 == 0 {
            Format::OpenMetrics
        } else {
            Format::PrometheusText
        };
        bytes += exporter.encode_as(format).len();
    }
    let end = vm_rss_kib();
    eprintln!(
        "VmRSS after warm-up {warm} KiB, after 2000 more scrapes {end} KiB ({bytes} bytes encoded)"
    );
    assert!(
        end <= warm + 1024,
        "VmRSS grew from {warm} KiB to {end} KiB over 2000 scrapes"
    );
}
