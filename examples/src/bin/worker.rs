//! A worker process: joins a pool and runs the jobs the pool assigns it,
//! printing each start, stop and notification. Start as many as you like,
//! on any machine that reaches the same Redis; dispatch with the `producer`
//! binary. Stop one with Ctrl-C (its jobs move to the others) or kill it
//! (they move after the worker TTL).
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379 cargo run -p flotilla-examples --bin worker -- --pool orders --name w1
//! ```

use clap::Parser;
use flotilla_examples::worker_process::{self, WorkerArgs};

/// A Flotilla worker process.
#[derive(Debug, Parser)]
#[command(about = "A Flotilla worker process: joins a pool and runs the jobs it is given")]
struct Cli {
    #[command(flatten)]
    worker: WorkerArgs,
}

#[tokio::main]
async fn main() -> Result<(), flotilla_examples::BoxError> {
    flotilla_examples::init_tracing();
    worker_process::run(Cli::parse().worker).await
}
