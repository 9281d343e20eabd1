//! A replicated map shared by several PROCESSES: each replica writes at the
//! same time (its own keys, a shared counter, a race for one key), then
//! waits until its local copy shows everyone's writes. Every replica ends
//! with the same contents, and exactly one wins the race.
//!
//! ```text
//! cargo run -p flotilla-examples --bin rmap_replicas
//! cargo run -p flotilla-examples --bin rmap_replicas -- --replicas 5 --writes 500
//! ```
//!
//! Uses `REDIS_URL` when set, otherwise starts a private `redis-server`.
//! The replicas are this binary re-executed with the hidden `replica`
//! subcommand.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_examples::BoxError;
use flotilla_examples::children::{Children, Output};
use flotilla_rmap::{Map, MapOptions};
use fred::prelude::ClientLike;

/// Replicas of one map in separate processes.
#[derive(Debug, Parser)]
#[command(about = "Replicas of one Flotilla map in separate processes, converging")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Replica processes.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Writes of the shared counter per replica.
    #[arg(long, default_value_t = 200)]
    writes: usize,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Run as one replica.
    #[command(hide = true)]
    Replica {
        #[arg(long)]
        redis: String,
        #[arg(long)]
        map: String,
        #[arg(long)]
        index: usize,
        #[arg(long)]
        replicas: usize,
        #[arg(long)]
        writes: usize,
    },
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    flotilla_examples::init_tracing();
    let cli = Cli::parse();
    if let Some(Command::Replica {
        redis,
        map,
        index,
        replicas,
        writes,
    }) = cli.command
    {
        return replica(&redis, &map, index, replicas, writes).await;
    }
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    flotilla_examples::check_url(&url)?;
    let map = flotilla_testkit::unique_name("replicas");
    println!(
        "{} replica processes of map {map:?}, {} counter increments each",
        cli.replicas, cli.writes
    );
    let mut children = Children::default();
    let mut lines = children.lines().ok_or("output already taken")?;
    let started = Instant::now();
    let (replicas, writes) = (cli.replicas.to_string(), cli.writes.to_string());
    for index in 0..cli.replicas {
        let index = index.to_string();
        children.spawn_self_with(
            &format!("replica-{index}"),
            &[
                "replica",
                "--redis",
                &url,
                "--map",
                &map,
                "--index",
                &index,
                "--replicas",
                &replicas,
                "--writes",
                &writes,
            ],
            Output::Captured,
        )?;
    }
    // Each replica prints one `RESULT <digest> <won>` line when converged.
    let mut digests = BTreeSet::new();
    let mut winners = 0;
    let mut done = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while done < cli.replicas {
        let (label, line) = tokio::time::timeout_at(deadline, lines.recv())
            .await?
            .ok_or("replica output ended")?;
        println!("[{label}] {line}");
        if let Some(rest) = line.strip_prefix("RESULT ") {
            let mut parts = rest.split_whitespace();
            digests.insert(parts.next().unwrap_or_default().to_string());
            winners += usize::from(parts.next() == Some("won"));
            done += 1;
        }
    }
    let killed = children.wait_all(Duration::from_secs(10)).await;
    let client = flotilla_testkit::client(&url).await?;
    Map::join(&client, &map, MapOptions::default())
        .await?
        .destroy()
        .await?;
    client.quit().await?;
    println!(
        "converged in {:?}: {} distinct final state(s) across {} replicas, {winners} race winner(s)",
        started.elapsed(),
        digests.len(),
        cli.replicas
    );
    if digests.len() != 1 || winners != 1 || !killed.is_empty() {
        return Err("replicas disagree, or the race did not have exactly one winner".into());
    }
    Ok(())
}

/// One replica: write concurrently with the others, wait until the local
/// copy shows every replica's writes, print a digest of it.
async fn replica(
    url: &str,
    name: &str,
    index: usize,
    replicas: usize,
    writes: usize,
) -> Result<(), BoxError> {
    let client = flotilla_testkit::client(url).await?;
    let map = Map::join(&client, name, MapOptions::default()).await?;
    let me = format!("replica-{index}");
    // A race: exactly one replica's set_if_not_exists succeeds.
    let won = map.set_if_not_exists("leader", &me).await?;
    for i in 0..writes {
        map.inc("counter", 1).await?;
        map.set(&me, &i.to_string()).await?;
    }
    map.append_unique_values("members", &[me.as_str()]).await?;
    let expected_counter = (replicas * writes).to_string();
    let last = (writes.saturating_sub(1)).to_string();
    map.wait_for(Duration::from_secs(20), |m| {
        m.get("counter").as_deref() == Some(expected_counter.as_str())
            && m.get_values("members").is_some_and(|v| v.len() == replicas)
            && (0..replicas)
                .all(|r| m.get(&format!("replica-{r}")).as_deref() == Some(last.as_str()))
    })
    .await?;
    let contents: BTreeMap<String, String> = map
        .snapshot()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut hasher = DefaultHasher::new();
    contents.hash(&mut hasher);
    println!(
        "sees {} fields, counter {}, leader {}, revision {}",
        contents.len(),
        contents.get("counter").map_or("?", String::as_str),
        contents.get("leader").map_or("?", String::as_str),
        map.revision()
    );
    println!(
        "RESULT {:016x} {}",
        hasher.finish(),
        if won { "won" } else { "lost" }
    );
    map.close().await;
    Ok(())
}
