//! One reader on one stream: add a few events and print them.
use std::time::Duration;

use flotilla_streaming::{Reader, ReaderOptions, Stream, StreamOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let stream = Stream::new(&client, "example-single-reader", StreamOptions::default())?;
    let reader = Reader::new(&client, &[&stream], ReaderOptions::default()).await?;
    let mut events = reader.events();
    for i in 0..5 {
        stream.add("tick", format!("payload {i}")).await?;
    }
    for _ in 0..5 {
        let e = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await?
            .ok_or("ended")?;
        println!("{} {} {:?}", e.id, e.name, e.payload);
    }
    reader.close().await;
    stream.destroy().await?;
    Ok(())
}
