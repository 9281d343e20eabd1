//! One reader over several streams; a stream added while it runs.
use std::time::Duration;

use flotilla_streaming::{Reader, ReaderOptions, Stream, StreamOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let opts = || StreamOptions::default().hash_tag("example");
    let a = Stream::new(&client, "inbox:a", opts())?;
    let b = Stream::new(&client, "inbox:b", opts())?;
    let c = Stream::new(&client, "inbox:c", opts())?;
    let reader = Reader::new(&client, &[&a, &b], ReaderOptions::default()).await?;
    let mut events = reader.events();
    a.add("hello", "from a").await?;
    b.add("hello", "from b").await?;
    reader.add_stream(&c, None).await?;
    c.add("hello", "from c").await?;
    for _ in 0..3 {
        let e = tokio::time::timeout(Duration::from_secs(5), events.next())
            .await?
            .ok_or("ended")?;
        println!("{} ({}): {:?}", e.stream, e.id, e.payload);
    }
    reader.close().await;
    for s in [a, b, c] {
        s.destroy().await?;
    }
    Ok(())
}
