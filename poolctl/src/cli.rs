//! Command-line arguments (clap derive).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};

/// Inspect and operate a Flotilla pool. Read commands never join the pool
/// and never write to Redis; admin commands require `--yes`.
#[derive(Debug, Parser)]
#[command(
    name = "poolctl",
    version,
    about,
    term_width = 80,
    after_help = "Exit codes: 0 ok; 1 error (Redis unreachable, job not found, \
                  operation refused by the pool); 2 usage (bad arguments, \
                  missing --pool, admin command without --yes)."
)]
pub(crate) struct Cli {
    /// Redis URL (`redis://[user:pass@]host:port[/db]`, `rediss://` for TLS).
    #[arg(
        long,
        global = true,
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379"
    )]
    pub(crate) redis: String,
    /// PEM file of the CA that signed the server's TLS certificate (for a
    /// `rediss://` URL); default: the system's trusted roots.
    #[arg(long, global = true, env = "REDIS_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// The pool to inspect or operate on.
    #[arg(long, global = true)]
    pub(crate) pool: Option<String>,
    /// Print JSON (stable schema, see README) instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,
    /// The pool's worker TTL, to tell active from stale workers (Redis does
    /// not store it). Examples: 30s, 500ms, 2m.
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration)]
    pub(crate) worker_ttl: Duration,
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Every command.
#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// List pools found in Redis (SCAN of fl:{*}:* keys).
    Pools,
    /// One screen: nodes, workers, jobs, pending, cleanups, queues, locks.
    Status,
    /// Nodes and their keep-alives.
    Nodes,
    /// Workers: node, host, pid, age, keep-alive age, jobs, state.
    Workers,
    /// Running jobs: key, owner, fencing token, age, payload size.
    Jobs {
        /// Only jobs owned by this worker.
        #[arg(long)]
        worker: Option<String>,
        /// Only keys starting with this prefix.
        #[arg(long)]
        prefix: Option<String>,
    },
    /// One job: owner, token, payload as hex and UTF-8 preview.
    Job {
        /// The job key.
        key: String,
    },
    /// Dispatches admitted but not yet started.
    Pending,
    /// Locks and leader leases with their holders.
    ///
    /// With --pool, the locks under the pool's hash tag; else every lock.
    Locks,
    /// The pool's streams: length, consumer groups, consumers, pending.
    Streams,
    /// Which worker the ring would choose for KEY now, and the ranking.
    Placement {
        /// The job key.
        key: String,
    },
    /// Live view of `status`; q or Ctrl-C quits.
    Watch {
        /// Render N frames as plain text to stdout (no terminal needed).
        #[arg(long)]
        frames: Option<u32>,
        /// Refresh period.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        interval: Duration,
        /// Width of a --frames rendering.
        #[arg(long, default_value_t = 80)]
        width: u16,
        /// Height of a --frames rendering.
        #[arg(long, default_value_t = 24)]
        height: u16,
    },
    /// Serve a web dashboard of the pool (read-only unless --admin-token).
    ///
    /// Pages: / (overview), /jobs, /jobs/KEY, /history; JSON under /api/;
    /// Prometheus text at /metrics. See README.md.
    Serve {
        /// Address to listen on (port 0 picks a free one).
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Enables admin actions for requests that send
        /// `Authorization: Bearer TOKEN`; without it the dashboard is
        /// read-only.
        #[arg(long, env = "POOLCTL_ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
    },
    /// Start a job (admin: needs --yes).
    Dispatch {
        /// The job key.
        key: String,
        /// File whose bytes are the payload (default: empty).
        #[arg(long)]
        payload_file: Option<PathBuf>,
        /// How long to wait for a worker to start the job.
        #[arg(long, default_value = "10s", value_parser = parse_duration)]
        timeout: Duration,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Stop a running job (admin: needs --yes).
    Stop {
        /// The job key.
        key: String,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Send a notification to a job's owner (admin: needs --yes).
    Notify {
        /// The job key.
        key: String,
        /// File whose bytes are the notification (default: empty).
        #[arg(long)]
        payload_file: Option<PathBuf>,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Drain a worker: no new job goes to it, and its jobs move to other
    /// workers (admin: needs --yes).
    ///
    /// With no other active worker its jobs stay until one joins.
    Drain {
        /// The worker id.
        worker: String,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Undrain a worker: it takes its share of jobs again (admin: needs
    /// --yes).
    Undrain {
        /// The worker id.
        worker: String,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Remove a dead worker now and requeue its jobs (admin: needs --yes).
    ///
    /// Refused while Redis holds a keep-alive of the worker within
    /// --worker-ttl (pass the pool's worker TTL).
    RemoveWorker {
        /// The worker id.
        worker: String,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
    /// Stop every job on every node and delete the pool (admin: needs --yes).
    Shutdown {
        /// How long to wait for the workers to go.
        #[arg(long, default_value = "30s", value_parser = parse_duration)]
        timeout: Duration,
        /// Really do it.
        #[arg(long)]
        yes: bool,
    },
}

/// Parses `250ms`, `1.5s`, `2m`, `1h` (a bare number is seconds).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 2m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "" | "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("unknown unit {unit:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || !(0.0..=1e9).contains(&secs) {
        return Err(format!("{text:?} is out of range"));
    }
    Ok(Duration::from_secs_f64(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert!(parse_duration("x").is_err());
        assert!(parse_duration("3d").is_err());
    }

    #[test]
    fn cli_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
