//! A `rediss://` URL in a build without TLS is refused, naming the feature;
//! with TLS built in, the same URL is tried and fails with the address.

use std::time::{Duration, Instant};

use flotilla_pool::{Error, Node, NodeOptions};

#[tokio::test]
async fn tls_url_without_the_tls_feature_is_refused_naming_it() {
    let options = NodeOptions::default().redis_timeout(Duration::from_millis(500));
    for url in [
        "rediss://127.0.0.1:1",
        "rediss-sentinel://127.0.0.1:1?sentinelServiceName=mymaster",
    ] {
        let t0 = Instant::now();
        let result = Node::connect(url, "quickstart", options.clone()).await;
        let took = t0.elapsed();
        let e = result.expect_err("nothing listens on port 1");
        let text = e.to_string();
        println!(
            "{url} (TLS built in: {}): {text} after {took:?}",
            flotilla_quickstart::tls_built_in()
        );
        if flotilla_quickstart::tls_built_in() {
            assert!(matches!(e, Error::Unavailable(_)), "{text}");
            assert!(text.contains("127.0.0.1:1"), "{text}");
        } else {
            assert!(
                matches!(e, Error::InvalidOptions { option: "url", .. }),
                "{text}"
            );
            assert!(text.contains("`tls` feature"), "{text}");
        }
        assert!(took < Duration::from_secs(2), "{url} took {took:?}");
    }
}
