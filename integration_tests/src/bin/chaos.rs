//! The chaos driver: worker processes, faults, a recovery window, then the
//! invariant checker over the ledgers. Exits non-zero on any violation.
//!
//! ```text
//! cargo run --release -p flotilla-integration-tests --bin chaos -- --duration 30m
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use flotilla_integration_tests::driver::{ChaosOptions, run};

/// Command line.
#[derive(Debug, Parser)]
#[command(
    about = "Chaos suite for a Flotilla pool: kills, pauses, partitions, Redis restarts, membership changes"
)]
struct Args {
    /// How long to inject faults: `90s`, `5m`, `1h` (or plain seconds).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    duration: Duration,
    /// Worker processes at the start (4–6 recommended).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Seed of the fault schedule and the load.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print the summary as JSON instead of a table.
    #[arg(long)]
    json: bool,
    /// Keep the ledgers in this directory.
    #[arg(long)]
    ledger_dir: Option<PathBuf>,
    /// Path of the flotilla-test-worker binary (default: next to this one).
    #[arg(long)]
    worker_binary: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    match unit {
        "" | "s" => Ok(Duration::from_secs(n)),
        "ms" => Ok(Duration::from_millis(n)),
        "m" => Ok(Duration::from_secs(n * 60)),
        "h" => Ok(Duration::from_secs(n * 3600)),
        _ => Err(format!("bad duration unit in {s:?} (use ms, s, m or h)")),
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut options = ChaosOptions::default()
        .duration(args.duration)
        .worker_processes(args.workers)
        .seed(args.seed);
    if let Some(dir) = args.ledger_dir {
        options = options.ledger_dir(dir);
    }
    if let Some(bin) = args.worker_binary {
        options = options.worker_binary(bin);
    }
    match run(options).await {
        Ok(summary) => {
            if args.json {
                println!("{:#}", summary.to_json());
            } else {
                print!("{}", summary.table());
            }
            if summary.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("chaos: {e}");
            ExitCode::from(2)
        }
    }
}
