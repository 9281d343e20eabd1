//! Topics: readers that filter by exact topic, glob pattern and predicate.
use std::time::Duration;

use flotilla_streaming::{AddOptions, Reader, ReaderOptions, Stream, StreamOptions, TopicFilter};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let stream = Stream::new(&client, "example-topics", StreamOptions::default())?;
    let filters = [
        ("exact eu.paid", TopicFilter::Exact("eu.paid".into())),
        ("pattern eu.*", TopicFilter::Pattern("eu.*".into())),
        (
            "predicate no topic",
            TopicFilter::predicate(|t| t.is_none()),
        ),
    ];
    let mut readers = Vec::new();
    for (label, f) in filters {
        let r = Reader::new(&client, &[&stream], ReaderOptions::default().topic(f)).await?;
        let ev = r.events();
        readers.push((label, r, ev));
    }
    for topic in ["eu.paid", "eu.new", "us.paid"] {
        stream
            .add_with("order", topic, AddOptions::default().topic(topic))
            .await?;
    }
    stream.add("heartbeat", "").await?;
    for (label, r, ev) in &mut readers {
        while let Ok(Some(e)) = tokio::time::timeout(Duration::from_millis(300), ev.next()).await {
            println!("{label}: {} topic={:?}", e.name, e.topic);
        }
        r.close().await;
    }
    stream.destroy().await?;
    Ok(())
}
