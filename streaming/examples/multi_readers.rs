//! Two readers on one stream: each sees every event (fan-out).
use std::time::Duration;

use flotilla_streaming::{Reader, ReaderOptions, Stream, StreamOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let stream = Stream::new(&client, "example-multi-readers", StreamOptions::default())?;
    let r1 = Reader::new(&client, &[&stream], ReaderOptions::default()).await?;
    let r2 = Reader::new(&client, &[&stream], ReaderOptions::default()).await?;
    let (mut e1, mut e2) = (r1.events(), r2.events());
    for i in 0..3 {
        stream.add("news", format!("item {i}")).await?;
    }
    for _ in 0..3 {
        let a = tokio::time::timeout(Duration::from_secs(5), e1.next())
            .await?
            .ok_or("ended")?;
        let b = tokio::time::timeout(Duration::from_secs(5), e2.next())
            .await?
            .ok_or("ended")?;
        println!("reader 1 got {}, reader 2 got {}", a.id, b.id);
    }
    r1.close().await;
    r2.close().await;
    stream.destroy().await?;
    Ok(())
}
