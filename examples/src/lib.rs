//! Runnable examples of Flotilla, and the demo.
//!
//! The programs are the binaries of this crate (`src/bin/`); see
//! `examples/README.md` for every example of the repository and its command.
//! This library holds what several of them share:
//!
//! * [`worker_process`]: a process that joins a pool and runs one worker
//!   (the `worker` binary, and the hidden `worker` subcommand the demo and
//!   the producer re-execute themselves with);
//! * [`children`]: starting such processes from the running binary, killed
//!   when their handle is dropped so that no program leaves one behind;
//! * [`fmt`]: small formatting helpers for the printed reports.
//!
//! ```no_run
//! # async fn demo() -> Result<(), flotilla_examples::BoxError> {
//! use flotilla_examples::children::Children;
//!
//! let (url, _server) = flotilla_testkit::redis_for_example()?;
//! let mut children = Children::default();
//! // Re-executes this binary as `<exe> worker --redis <url> --pool orders`.
//! children.spawn_self("w1", &["worker", "--redis", &url, "--pool", "orders"])?;
//! // ... dispatch jobs through Redis ...
//! children.kill_all().await; // also done on drop
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

pub mod children;
pub mod fmt;
pub mod worker_process;

/// The error type of the example programs.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Refuses a TLS URL (`rediss://`, `valkeys://`) when this build has no
/// TLS support: fred would then connect in plain text, logging only a
/// warning. Build with `--features tls` to use one.
///
/// # Errors
/// A message saying so, or fred's error for a malformed URL.
pub fn check_url(url: &str) -> Result<(), BoxError> {
    let scheme = url
        .split("://")
        .next()
        .unwrap_or_default()
        .to_ascii_lowercase();
    let wants_tls = scheme.starts_with("rediss") || scheme.starts_with("valkeys");
    if wants_tls && !fred::prelude::Config::from_url(url)?.uses_tls() {
        return Err(format!(
            "{scheme}:// asks for TLS but this build has none: run with `--features tls` \
             (flotilla-pool's `tls` feature)"
        )
        .into());
    }
    Ok(())
}

/// The root README, so that its Rust code is compiled by `cargo test --doc`.
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct RootReadme;

/// Logs warnings and errors to stderr (`RUST_LOG` overrides the level).
pub fn init_tracing() {
    init_tracing_at("warn");
}

/// Logs to stderr at `level` (`RUST_LOG` overrides it).
pub fn init_tracing_at(level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
