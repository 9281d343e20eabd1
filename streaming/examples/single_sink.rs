//! One sink member: consume and ack events.
use std::time::Duration;

use flotilla_streaming::{Sink, SinkOptions, StartPosition, Stream, StreamOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let stream = Stream::new(&client, "example-single-sink", StreamOptions::default())?;
    for i in 0..5 {
        stream.add("job", format!("job {i}")).await?;
    }
    let sink = Sink::join(
        &client,
        "workers",
        &[&stream],
        SinkOptions::default().start(StartPosition::Oldest),
    )
    .await?;
    let mut events = sink.events();
    for _ in 0..5 {
        let e = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await?
            .ok_or("ended")?;
        println!("{} handles {} {:?}", sink.member_id(), e.id, e.payload);
        sink.ack(&e).await?;
    }
    sink.close().await;
    stream.destroy().await?;
    Ok(())
}
