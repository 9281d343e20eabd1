//! Two replicas of one map, a write, and a subscriber.
//!
//! `cargo run -p flotilla-rmap --example rmap_basics` (uses `REDIS_URL`, or
//! starts a private redis-server).

use std::time::Duration;

use flotilla_rmap::{Map, MapOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client_a = flotilla_testkit::client(&url).await?;
    let client_b = flotilla_testkit::client(&url).await?;

    let a = Map::join(&client_a, "example-settings", MapOptions::default()).await?;
    let b = Map::join(&client_b, "example-settings", MapOptions::default()).await?;
    let mut events = b.subscribe();

    a.set_and_wait("mode", "fast").await?;
    println!("a sees mode = {:?}", a.get("mode"));

    let event = tokio::time::timeout(Duration::from_secs(5), events.next()).await?;
    println!("b was told: {event:?}");
    println!("b sees mode = {:?}", b.get("mode"));

    a.append_unique_values("tags", &["red", "blue"]).await?;
    b.wait_for(Duration::from_secs(5), |m| m.get_values("tags").is_some())
        .await?;
    println!("b sees tags = {:?}", b.get_values("tags"));

    a.destroy().await?;
    b.close().await;
    Ok(())
}
