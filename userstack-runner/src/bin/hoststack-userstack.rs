//! hoststack-userstack: runs the user-space TCP stack as its own process, started and watched
//! by the agent's dataplane supervisor.
//!
//!     hoststack-userstack run --config FILE --stats FILE [--stats-interval-ms 1000]
//!
//! It sets up the devices (for AF_XDP: a socket per queue and the redirect program), starts
//! one pinned shard per core, writes the stats file (state `running` once every shard
//! serves, then every interval), and on SIGTERM or SIGINT drains, writes the last stats
//! (`stopped`), detaches its XDP program and exits 0. A bad configuration or a failed setup
//! is one line on stderr and exit code 2, with nothing left attached. Killed, it leaves
//! nothing either: the XDP link belongs to its descriptors, which the kernel closes.

use hoststack_runner_api::RunState;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use userstack_runner::runtime::{config, stats, Runtime};

const USAGE: &str =
    "usage: hoststack-userstack run --config FILE --stats FILE [--stats-interval-ms MS]";

static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// The command line.
#[derive(Debug)]
struct Args {
    config: PathBuf,
    stats: PathBuf,
    interval: Duration,
}

fn parse_args(args: &[String]) -> Result<Args, String> {
    let mut iter = args.iter();
    if iter.next().map(String::as_str) != Some("run") {
        return Err(USAGE.into());
    }
    let (mut config, mut stats, mut interval) = (None, None, Duration::from_millis(1000));
    while let Some(flag) = iter.next() {
        let value = iter
            .next()
            .ok_or_else(|| format!("{flag} needs a value; {USAGE}"))?;
        match flag.as_str() {
            "--config" => config = Some(PathBuf::from(value)),
            "--stats" => stats = Some(PathBuf::from(value)),
            "--stats-interval-ms" => {
                let ms: u64 = value.parse().ok().filter(|&ms| ms > 0).ok_or_else(|| {
                    format!("--stats-interval-ms {value:?} is not a positive number")
                })?;
                interval = Duration::from_millis(ms);
            }
            other => return Err(format!("unknown flag {other}; {USAGE}")),
        }
    }
    Ok(Args {
        config: config.ok_or_else(|| format!("--config is required; {USAGE}"))?,
        stats: stats.ok_or_else(|| format!("--stats is required; {USAGE}"))?,
        interval,
    })
}

fn install_signal_handlers() {
    for signal in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(
                signal,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

fn run(args: &Args) -> Result<(), String> {
    let text = std::fs::read_to_string(&args.config)
        .map_err(|e| format!("reading {}: {e}", args.config.display()))?;
    let config = config::from_json(&text)?;
    let write = |runtime: &Runtime, state| {
        stats::write(&args.stats, &runtime.stats(state))
            .map_err(|e| format!("writing {}: {e}", args.stats.display()))
    };
    let mut runtime = Runtime::start(&config)?;
    write(&runtime, RunState::Running)?;
    let mut last = Instant::now();
    while !STOP.load(Ordering::SeqCst) {
        std::thread::sleep(Duration::from_millis(10));
        if last.elapsed() >= args.interval {
            last = Instant::now();
            // A failed periodic write is retried next interval; the supervisor sees the age.
            let _ = write(&runtime, RunState::Running);
        }
    }
    runtime.begin_stop();
    while !runtime.is_stopped() {
        std::thread::sleep(Duration::from_millis(10));
        if last.elapsed() >= args.interval {
            last = Instant::now();
            let _ = write(&runtime, RunState::Draining);
        }
    }
    runtime.stop();
    write(&runtime, RunState::Stopped)
}

fn main() -> ExitCode {
    install_signal_handlers();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse_args(&args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("hoststack-userstack: {e}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("hoststack-userstack: {}", e.replace('\n', " "));
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn reads_the_contract_command_line() {
        let parsed = parse_args(&args(&[
            "run",
            "--config",
            "c.json",
            "--stats",
            "s.json",
            "--stats-interval-ms",
            "250",
        ]))
        .unwrap();
        assert_eq!(parsed.config, PathBuf::from("c.json"));
        assert_eq!(parsed.stats, PathBuf::from("s.json"));
        assert_eq!(parsed.interval, Duration::from_millis(250));
        let default = parse_args(&args(&["run", "--stats", "s", "--config", "c"])).unwrap();
        assert_eq!(default.interval, Duration::from_millis(1000));
    }

    #[test]
    fn bad_command_lines_say_what_is_wrong() {
        for (words, expected) in [
            (&[][..], "usage"),
            (&["serve"][..], "usage"),
            (&["run", "--stats", "s"][..], "--config is required"),
            (&["run", "--config", "c"][..], "--stats is required"),
            (&["run", "--config"][..], "--config needs a value"),
            (
                &[
                    "run",
                    "--config",
                    "c",
                    "--stats",
                    "s",
                    "--stats-interval-ms",
                    "0",
                ][..],
                "not a positive",
            ),
            (
                &["run", "--config", "c", "--verbose", "1"][..],
                "unknown flag --verbose",
            ),
        ] {
            let error = parse_args(&args(words)).unwrap_err();
            assert!(error.contains(expected), "{words:?}: {error}");
        }
    }
}
