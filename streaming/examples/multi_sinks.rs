//! Three members of one sink share the work: each event goes to one member.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_streaming::{Sink, SinkOptions, StartPosition, Stream, StreamOptions};
use futures::StreamExt;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = flotilla_testkit::redis_for_example()?;
    let client = flotilla_testkit::client(&url).await?;
    let stream = Stream::new(&client, "example-multi-sinks", StreamOptions::default())?;
    let counts: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
    let mut sinks = Vec::new();
    for _ in 0..3 {
        let options = SinkOptions::default()
            .start(StartPosition::Oldest)
            .max_events(10);
        let sink = Arc::new(Sink::join(&client, "workers", &[&stream], options).await?);
        let (s, counts) = (sink.clone(), counts.clone());
        tokio::spawn(async move {
            let mut events = s.events();
            while let Some(e) = events.next().await {
                if s.ack(&e).await.is_ok() {
                    *counts
                        .lock()
                        .unwrap()
                        .entry(s.member_id().to_string())
                        .or_default() += 1;
                }
            }
        });
        sinks.push(sink);
    }
    for i in 0..300 {
        stream.add("job", i.to_string()).await?;
    }
    flotilla_testkit::wait_until(Duration::from_secs(10), "all handled", || async {
        counts.lock().unwrap().values().sum::<usize>() == 300
    })
    .await?;
    for (member, n) in counts.lock().unwrap().iter() {
        println!("{member}: {n} events");
    }
    for sink in &sinks {
        sink.close().await;
    }
    stream.destroy().await?;
    Ok(())
}
