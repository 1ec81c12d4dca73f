//! Runs a simulator scenario and prints its report as JSON.
//!
//! Usage: `userstack-sim SCENARIO.toml [--seed N]...` — one report per seed (default seed 1).

use std::process::ExitCode;
use userstack_sim::{run, scenario::Scenario};

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    let mut seeds = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--seed" => match args.next().and_then(|s| s.parse::<u64>().ok()) {
                Some(seed) => seeds.push(seed),
                None => {
                    eprintln!("--seed needs an unsigned integer");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("usage: userstack-sim SCENARIO.toml [--seed N]...");
                return ExitCode::SUCCESS;
            }
            _ => path = Some(arg),
        }
    }
    let Some(path) = path else {
        eprintln!("usage: userstack-sim SCENARIO.toml [--seed N]...");
        return ExitCode::from(2);
    };
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(1);
        }
    };
    let scenario = match Scenario::from_toml(&text) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(1);
        }
    };
    if seeds.is_empty() {
        seeds.push(1);
    }
    for seed in seeds {
        let report = run(&scenario, seed);
        match serde_json::to_string_pretty(&report) {
            Ok(json) => {
                use std::io::Write;
                if writeln!(std::io::stdout().lock(), "{json}").is_err() {
                    return ExitCode::SUCCESS;
                }
            }
            Err(e) => {
                eprintln!("serialising report: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
}
