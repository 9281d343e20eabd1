//! `poolctl`: inspect and operate a Flotilla pool from the command line.
//!
//! Read commands (`pools`, `status`, `nodes`, `workers`, `jobs`, `job`,
//! `pending`, `locks`, `streams`, `placement`, `watch`) decode the pool's
//! keys with `flotilla_pool::inspect`: read commands only, no join, no
//! write. Admin commands (`dispatch`, `stop`, `notify`, `shutdown`) join as
//! a client-only node and need `--yes`. `serve` runs a web dashboard
//! (see `serve/mod.rs`). Exit codes: 0 ok, 1 error, 2 usage.
//! See README.md.
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod admin;
mod cli;
mod commands;
mod connect;
mod error;
mod format;
mod render;
mod serve;
mod views;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use cli::{Cli, Command};
use error::{CtlResult, EXIT_OK};

fn main() -> ExitCode {
    // clap exits with 2 on usage errors and 0 for --help / --version.
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("POOLCTL_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_writer(std::io::stderr)
        .init();
    // The dashboard serves requests while a background task decodes a
    // large reading (CPU-bound for a good part of a second with 100,000
    // jobs): more workers than that task can hold, so requests and the
    // client's I/O never wait behind it. Every other command is one task.
    let runtime = match &cli.command {
        Command::Serve { .. } => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(4);
            b
        }
        _ => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build();
    let runtime = match runtime {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(error::EXIT_ERROR);
        }
    };
    match runtime.block_on(run(&cli)) {
        Ok(()) => ExitCode::from(EXIT_OK),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

async fn run(cli: &Cli) -> CtlResult {
    // Usage checks come before connecting: a refused admin command never
    // touches Redis.
    match &cli.command {
        Command::Dispatch { yes, .. } => admin::confirm("dispatch a job", *yes)?,
        Command::Stop { yes, .. } => admin::confirm("stop a job", *yes)?,
        Command::Notify { yes, .. } => admin::confirm("notify a job's owner", *yes)?,
        Command::Shutdown { yes, .. } => admin::confirm("shut the pool down", *yes)?,
        Command::Drain { yes, .. } => admin::confirm("drain a worker", *yes)?,
        Command::Undrain { yes, .. } => admin::confirm("undrain a worker", *yes)?,
        Command::RemoveWorker { yes, .. } => admin::confirm("remove a worker", *yes)?,
        Command::Pools | Command::Locks => {}
        Command::Serve {
            listen,
            admin_token,
        } => {
            let pool = commands::need_pool(cli)?;
            let options = serve::ServeOptions {
                listen: *listen,
                admin_token: admin_token.clone(),
                worker_ttl: cli.worker_ttl,
            };
            // Connects by itself, and keeps trying while Redis is down.
            return serve::run(cli, pool, options).await;
        }
        Command::Watch { frames: None, .. } => {
            commands::need_pool(cli)?;
            watch::need_terminal()?;
        }
        _ => {
            commands::need_pool(cli)?;
        }
    }
    let client = connect::connect(&cli.redis, cli.tls_ca.as_deref()).await?;
    match &cli.command {
        Command::Dispatch { .. }
        | Command::Stop { .. }
        | Command::Notify { .. }
        | Command::Shutdown { .. }
        | Command::Drain { .. }
        | Command::Undrain { .. }
        | Command::RemoveWorker { .. } => admin::run(cli, &client).await,
        Command::Watch {
            frames,
            interval,
            width,
            height,
        } => {
            let opts = watch::WatchOptions {
                frames: *frames,
                interval: *interval,
                width: *width,
                height: *height,
                worker_ttl: cli.worker_ttl,
            };
            watch::run(cli, &client, opts).await
        }
        _ => commands::run(cli, &client).await,
    }
}
