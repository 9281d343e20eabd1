//! `--peer bullmq`: installs BullMQ with npm (outside the repository), runs
//! `peer/bullmq/peer.mjs` against the same Redis, and reports its figures
//! next to ours with the ratios.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::Deserialize;
use tokio::process::Command;

use crate::report::{Figure, Report};
use crate::{BoxError, Ctx};

/// The peer script, written next to the installed `node_modules`.
const SCRIPT: &str = include_str!("../peer/bullmq/peer.mjs");
/// The BullMQ major version the script is written for.
const BULLMQ: &str = "bullmq@5";
const LATENCY_SAMPLES: usize = 1_000;

/// The peers `--peer` accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Peer {
    /// BullMQ (Node.js), installed with npm.
    Bullmq,
}

/// What `peer.mjs` prints.
#[derive(Debug, Deserialize)]
struct PeerResult {
    jobs: u64,
    concurrency: u64,
    elapsed_s: f64,
    throughput: f64,
    latency_samples: u64,
    /// `null` when no latency samples were taken.
    latency_p50_ms: Option<f64>,
    latency_p99_ms: Option<f64>,
    commands_per_job: f64,
    commands_breakdown: String,
    redis_cpu_us_per_job: f64,
    client_cpu_us_per_job: f64,
}

/// Where BullMQ is installed: `--peer-dir`, else `<target dir>/bench-peer/bullmq`
/// (the target dir found from this executable's path), else a temp dir.
pub fn default_dir() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("bench-peer").join("bullmq")))
        .unwrap_or_else(|| {
            std::env::temp_dir()
                .join("flotilla-bench-peer")
                .join("bullmq")
        })
}

/// Runs the peer and adds its figures.
pub async fn run(ctx: &Ctx, report: &mut Report, dir: &Path) -> Result<(), BoxError> {
    for tool in ["node", "npm"] {
        let found = Command::new(tool)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .await
            .map(|s| s.success())
            .unwrap_or(false);
        if !found {
            return Err(format!(
                "`--peer bullmq` needs Node.js and npm on PATH, and `{tool}` was not found \
                 (Debian/Ubuntu: `sudo apt-get install -y nodejs npm`)"
            )
            .into());
        }
    }
    std::fs::create_dir_all(dir)?;
    if !dir.join("node_modules/bullmq/package.json").exists() {
        ctx.progress(
            "peer",
            &format!("npm install {BULLMQ} into {}", dir.display()),
        );
        let status = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(dir)
            .arg(BULLMQ)
            .stdout(Stdio::null())
            .status()
            .await?;
        if !status.success() {
            return Err(format!("npm install {BULLMQ} failed ({status})").into());
        }
    }
    let peer = run_script(ctx, dir, LATENCY_SAMPLES).await?;
    push_figures(report, &peer);
    if ctx.opts.rounds > 1 {
        rounds(ctx, report, dir, &peer).await?;
    }
    Ok(())
}

/// Runs `peer.mjs` once: `--jobs` jobs, then `samples` one at a time.
async fn run_script(ctx: &Ctx, dir: &Path, samples: usize) -> Result<PeerResult, BoxError> {
    let script = dir.join("peer.mjs");
    std::fs::write(&script, SCRIPT)?;
    ctx.progress(
        "peer",
        &format!(
            "bullmq: {} jobs, concurrency {}",
            ctx.opts.jobs, ctx.opts.concurrency
        ),
    );
    let output = Command::new("node")
        .arg(&script)
        .arg(&ctx.url)
        .arg(ctx.opts.jobs.to_string())
        .arg(ctx.opts.concurrency.to_string())
        .arg(samples.to_string())
        .stderr(Stdio::inherit())
        .output()
        .await?;
    if !output.status.success() {
        return Err(format!("the bullmq peer script failed ({})", output.status).into());
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("the bullmq peer printed no result")?;
    Ok(serde_json::from_str(line)?)
}

fn push_figures(report: &mut Report, peer: &PeerResult) {
    report.push(
        Figure::new(
            "peer",
            "bullmq_throughput",
            "BullMQ throughput (add + process)",
        )
        .value(peer.throughput, "jobs/s")
        .detail(format!(
            "{} jobs in {:.2} s, {} adds in flight, worker concurrency {}",
            peer.jobs, peer.elapsed_s, peer.concurrency, peer.concurrency
        )),
    );
    if let Some(ours) = report.get("dispatch", "throughput") {
        report.push(
            Figure::new("peer", "throughput_ratio", "throughput Flotilla / BullMQ")
                .value(ours / peer.throughput, "x")
                .at_least(3.0, ">= 3x")
                .detail(format!("Flotilla {ours:.0} jobs/s")),
        );
    }
    if let (Some(p50), Some(p99)) = (peer.latency_p50_ms, peer.latency_p99_ms) {
        report.push(
            Figure::new(
                "peer",
                "bullmq_latency_p50",
                "BullMQ add → process start p50",
            )
            .value(p50, "ms")
            .detail(format!(
                "p99 {p99:.3} ms; {} jobs one at a time",
                peer.latency_samples
            )),
        );
        report.push(
            Figure::new(
                "peer",
                "bullmq_latency_p99",
                "BullMQ add → process start p99",
            )
            .value(p99, "ms"),
        );
        if let Some(ours) = report.get("dispatch", "latency_p50") {
            report.push(
                Figure::new("peer", "latency_p50_ratio", "latency p50 Flotilla / BullMQ")
                    .value(ours / p50, "x")
                    .detail("below 1: Flotilla starts a job sooner"),
            );
        }
        if let Some(ours) = report.get("dispatch", "latency_p99") {
            report.push(
                Figure::new("peer", "latency_p99_ratio", "latency p99 Flotilla / BullMQ")
                    .value(ours / p99, "x"),
            );
        }
    }
    report.push(
        Figure::new(
            "peer",
            "bullmq_commands_per_job",
            "BullMQ Redis commands per job",
        )
        .value(peer.commands_per_job, "commands")
        .detail(format!(
            "INFO commandstats incl. inside scripts, add to completion: {}",
            peer.commands_breakdown
        )),
    );
    report.push(
        Figure::new(
            "peer",
            "bullmq_redis_cpu_per_job",
            "BullMQ Redis CPU per job",
        )
        .value(peer.redis_cpu_us_per_job, "µs")
        .detail("INFO cpu, add to completion"),
    );
    report.push(
        Figure::new(
            "peer",
            "bullmq_client_cpu_per_job",
            "BullMQ client process CPU per job",
        )
        .value(peer.client_cpu_us_per_job, "µs")
        .detail("process.cpuUsage() of the node process (queue and worker)"),
    );
    if let Some(ours) = report.get("commands", "total") {
        report.push(
            Figure::new(
                "peer",
                "commands_ratio",
                "commands per job Flotilla / BullMQ",
            )
            .value(ours / peer.commands_per_job, "x"),
        );
    }
}

/// One pair of `--rounds`: Flotilla's and the peer's throughput and Redis
/// CPU per job.
struct Pair {
    ours: f64,
    ours_redis_us: f64,
    peer: f64,
    peer_redis_us: f64,
}

/// The median of `values` (the mean of the middle two when even).
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => values[n / 2],
        _ => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// `--rounds N`: N − 1 more pairs of throughput runs, Flotilla (a fresh
/// pool) then BullMQ (a fresh queue, no latency samples), after the pair the
/// report already holds; figures of the medians, each pair in the detail.
/// This VM's speed drifts within seconds, so a pair run back to back
/// compares like with like better than one run of each minutes apart.
async fn rounds(
    ctx: &Ctx,
    report: &mut Report,
    dir: &Path,
    first_peer: &PeerResult,
) -> Result<(), BoxError> {
    let mut pairs = Vec::new();
    if let (Some(ours), Some(ours_redis_us)) = (
        report.get("dispatch", "throughput"),
        report.get("dispatch", "redis_cpu_per_job"),
    ) {
        pairs.push(Pair {
            ours,
            ours_redis_us,
            peer: first_peer.throughput,
            peer_redis_us: first_peer.redis_cpu_us_per_job,
        });
    }
    for round in 2..=ctx.opts.rounds {
        let run = crate::sections::dispatch::throughput_round(ctx, round).await?;
        let peer = run_script(ctx, dir, 0).await?;
        pairs.push(Pair {
            ours: run.jobs_per_s(),
            ours_redis_us: run.redis_us_per_job(),
            peer: peer.throughput,
            peer_redis_us: peer.redis_cpu_us_per_job,
        });
    }
    let detail = pairs
        .iter()
        .enumerate()
        .map(|(i, p)| {
            format!(
                "pair {}: {:.0} / {:.0} jobs/s = {:.2}x, Redis {:.1} / {:.1} µs per job",
                i + 1,
                p.ours,
                p.peer,
                p.ours / p.peer,
                p.ours_redis_us,
                p.peer_redis_us
            )
        })
        .collect::<Vec<_>>()
        .join("; ");
    report.push(
        Figure::new(
            "peer",
            "throughput_ratio_median",
            "throughput Flotilla / BullMQ, median of pairs",
        )
        .value(median(pairs.iter().map(|p| p.ours / p.peer).collect()), "x")
        .at_least(3.0, ">= 3x")
        .detail(detail),
    );
    report.push(
        Figure::new(
            "peer",
            "throughput_median",
            "Flotilla throughput, median of pairs",
        )
        .value(median(pairs.iter().map(|p| p.ours).collect()), "jobs/s")
        .detail(format!("{} pairs", pairs.len())),
    );
    report.push(
        Figure::new(
            "peer",
            "bullmq_throughput_median",
            "BullMQ throughput, median of pairs",
        )
        .value(median(pairs.iter().map(|p| p.peer).collect()), "jobs/s")
        .detail(format!("{} pairs", pairs.len())),
    );
    report.push(
        Figure::new(
            "peer",
            "redis_cpu_ratio_median",
            "Redis CPU per job Flotilla / BullMQ, median of pairs",
        )
        .value(
            median(
                pairs
                    .iter()
                    .map(|p| p.ours_redis_us / p.peer_redis_us)
                    .collect(),
            ),
            "x",
        )
        .detail("BullMQ's includes completing each job"),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_odd_and_even_counts() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }
}
