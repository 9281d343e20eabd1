//! The servers' and Sentinels' logs of a run, kept past it on request.
//!
//! Every [`RedisServer`](crate::RedisServer) and [`Sentinels`](crate::Sentinels)
//! deployment writes its logs into a temporary directory that goes when it is
//! dropped. With the environment variable `FLOTILLA_KEEP_LOGS` set to a
//! directory, each copies its `*.log` files there first, into a folder named
//! after its temporary directory, and the servers log at `notice` (their
//! replication, failover and persistence events) instead of `warning`: what
//! a chaos soak needs to tell why a replica missed writes.

use std::path::{Path, PathBuf};

/// The environment variable that names the directory logs are kept in.
pub const KEEP_LOGS_ENV: &str = "FLOTILLA_KEEP_LOGS";

/// Where logs are kept, when asked for.
pub(crate) fn keep_dir() -> Option<PathBuf> {
    std::env::var_os(KEEP_LOGS_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// The level the servers log at: `notice` when logs are kept.
pub(crate) fn server_log_level() -> &'static str {
    if keep_dir().is_some() {
        "notice"
    } else {
        "warning"
    }
}

/// Copies the `*.log` files of `from` (a temporary directory about to go)
/// into the kept-logs directory, when one is set.
pub(crate) fn keep_logs_of(from: &Path) {
    if let Some(to) = keep_dir() {
        copy_logs(from, &to);
    }
}

/// Copies the `*.log` files of `from` into `to`, under `from`'s own name.
/// Failures are reported on stderr: a teardown has nobody else to tell.
fn copy_logs(from: &Path, to: &Path) {
    let Some(name) = from.file_name() else {
        return;
    };
    let target = to.join(name);
    if let Err(e) = std::fs::create_dir_all(&target) {
        eprintln!(
            "flotilla-testkit: cannot keep logs in {}: {e}",
            target.display()
        );
        return;
    }
    let Ok(entries) = std::fs::read_dir(from) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "log")
            && let Err(e) = std::fs::copy(&path, target.join(entry.file_name()))
        {
            eprintln!("flotilla-testkit: cannot keep {}: {e}", path.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only `*.log` files are copied, into a folder named after the
    /// directory they came from.
    #[test]
    fn logs_are_copied_under_their_directory_name() {
        let from = tempfile::Builder::new()
            .prefix("flotilla-redis-")
            .tempdir()
            .unwrap();
        std::fs::write(from.path().join("redis.log"), "ready").unwrap();
        std::fs::write(from.path().join("dump.rdb"), "data").unwrap();
        let to = tempfile::tempdir().unwrap();
        copy_logs(from.path(), to.path());
        let kept = to.path().join(from.path().file_name().unwrap());
        assert_eq!(
            std::fs::read_to_string(kept.join("redis.log")).unwrap(),
            "ready"
        );
        assert!(!kept.join("dump.rdb").exists());
    }
}
