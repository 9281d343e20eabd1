//! `poolctl serve` in a real browser: headless Chromium driven through
//! WebDriver (Debian's `chromium` and `chromium-driver`). Loads the
//! overview of a live pool, checks that worker ids and job counts are in
//! the rendered DOM and that the page refreshes itself, clicks through to
//! a job, stops it with the admin token, drains a worker from its row of
//! the overview, and saves screenshots under
//! `<target>/screenshots/`.

mod support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use flotilla_testkit::wait_until;
use support::LivePool;
use support::dashboard::{Dashboard, TOKEN};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// `<target>/screenshots`.
fn screenshot_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("target dir")
        .join("screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(browser: &Client, name: &str) -> PathBuf {
    let png = browser.screenshot().await.unwrap();
    assert!(png.starts_with(b"\x89PNG"), "not a PNG");
    let path = screenshot_dir().join(name);
    std::fs::write(&path, png).unwrap();
    eprintln!("screenshot: {}", path.display());
    path
}

async fn text(browser: &Client, css: &str) -> String {
    browser
        .find(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("no {css}: {e}"))
        .text()
        .await
        .unwrap()
}

/// A chromedriver on a free loopback port; killed on drop.
async fn chromedriver() -> (tokio::process::Child, String) {
    for (binary, package) in [(CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")] {
        assert!(
            Path::new(binary).exists(),
            "{binary} is missing: install it with `apt-get install -y {package}` \
             (the browser test drives Debian's chromium through chromium-driver)"
        );
    }
    let port = flotilla_testkit::free_port().unwrap();
    let child = tokio::process::Command::new(CHROMEDRIVER)
        .arg(format!("--port={port}"))
        .arg("--allowed-ips=127.0.0.1")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("chromedriver starts");
    let url = format!("http://127.0.0.1:{port}");
    wait_until(
        Duration::from_secs(20),
        "chromedriver listens",
        || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
        },
    )
    .await
    .unwrap();
    (child, url)
}

async fn browser(driver: &str, profile: &Path) -> Client {
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            "binary": CHROMIUM,
            "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1280,1000",
                format!("--user-data-dir={}", profile.display()),
            ],
        }),
    );
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(caps)
        .connect(driver)
        .await
        .expect("a Chromium session through chromedriver")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overview_and_job_page_in_a_real_browser() {
    let live = LivePool::start("dash-browser").await;
    // A few more jobs, so the counts and the chart show something.
    for i in 0..40 {
        live.nodes[i % 2]
            .dispatch_job(&format!("customer-{i:03}"), format!("{{\"customer\":{i}}}"))
            .await
            .unwrap();
    }
    let dash = Dashboard::start(&live.server.url(), &live.pool, true).await;
    let (_driver, driver_url) = chromedriver().await;
    let profile = tempfile::tempdir().unwrap();
    let b = browser(&driver_url, profile.path()).await;

    // Overview: worker ids and counts in the DOM.
    b.goto(&dash.url("/")).await.unwrap();
    for w in &live.workers {
        b.wait()
            .at_most(Duration::from_secs(10))
            .for_element(Locator::Css(&format!(r#"tr[data-worker="{}"]"#, w.id())))
            .await
            .unwrap_or_else(|e| panic!("worker {} not shown: {e}", w.id()));
    }
    assert_eq!(text(&b, r#"[data-count="running"]"#).await, "45");
    assert_eq!(text(&b, r#"[data-count="active_workers"]"#).await, "3/3");
    assert!(text(&b, "#locks").await.contains("scheduler"));
    assert_eq!(text(&b, "#redis-status").await, "Redis ok");

    // It refreshes itself: a new job shows up without a reload.
    live.nodes[0].dispatch_job("late-job", "").await.unwrap();
    wait_until(
        Duration::from_secs(15),
        "the running count refreshes",
        || {
            let b = &b;
            async move { text(b, r#"[data-count="running"]"#).await == "46" }
        },
    )
    .await
    .unwrap();
    // Let the chart catch up with the history flushes, then capture.
    wait_until(Duration::from_secs(15), "the chart has a peak", || {
        let b = &b;
        async move { text(b, ".mini .peak").await != "peak 0" }
    })
    .await
    .unwrap();
    screenshot(&b, "overview.png").await;

    // Through the jobs list to a job page.
    b.find(Locator::LinkText("Jobs"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("table#jobs"))
        .await
        .unwrap();
    screenshot(&b, "jobs.png").await;
    b.find(Locator::Css(r#"a.job-link[href="/jobs/job-b"]"#))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    b.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css("#job-key"))
        .await
        .unwrap();
    assert_eq!(text(&b, "#job-key").await, "job-b");
    let owner = text(&b, "#job-owner").await;
    assert!(
        live.workers.iter().any(|w| w.id() == owner),
        "owner {owner:?}"
    );
    assert!(text(&b, "#payload-text").await.contains("bravo payload"));
    assert!(text(&b, "#job-token").await.parse::<u64>().unwrap() > 0);

    // Stop it with the admin token (sent as a bearer header by the page).
    b.find(Locator::Css("#admin-token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    b.find(Locator::Css(r#"button[data-action="stop"]"#))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    wait_until(Duration::from_secs(15), "the stop is answered", || {
        let b = &b;
        async move { text(b, "#action-result").await.starts_with("200") }
    })
    .await
    .unwrap();
    assert!(!live.seen.lock().unwrap().running.contains_key("job-b"));
    screenshot(&b, "job.png").await;

    // Drain a worker from its row on the overview (the token is kept in
    // this tab): its state shows "drained" and its jobs move away.
    b.goto(&dash.url("/")).await.unwrap();
    let drained = live.workers[0].id().to_string();
    let row = format!(r#"tr[data-worker="{drained}"]"#);
    // The rows are re-rendered every refresh: a button found just before
    // may be gone when clicked, so a miss is tried again (a drain is
    // idempotent).
    let button = format!(r#"{row} button[data-worker-action="drain"]"#);
    wait_until(
        Duration::from_secs(15),
        "the Drain button is clicked",
        || {
            let (b, button) = (&b, &button);
            async move {
                match b.find(Locator::Css(button)).await {
                    Ok(el) => el.click().await.is_ok(),
                    Err(_) => false,
                }
            }
        },
    )
    .await
    .unwrap();
    wait_until(Duration::from_secs(15), "the drain is answered", || {
        let b = &b;
        async move { text(b, "#action-result").await.starts_with("200") }
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(15), "the row shows drained", || {
        let (b, row) = (&b, &row);
        async move {
            match b.find(Locator::Css(&format!("{row} .state"))).await {
                Ok(el) => el.text().await.is_ok_and(|t| t == "drained"),
                Err(_) => false,
            }
        }
    })
    .await
    .unwrap();
    wait_until(Duration::from_secs(15), "its jobs moved", || {
        let (live, drained) = (&live, &drained);
        async move {
            let seen = live.seen.lock().unwrap();
            seen.running.values().all(|(w, _)| w != drained)
        }
    })
    .await
    .unwrap();
    screenshot(&b, "overview-drained.png").await;

    b.goto(&dash.url("/history")).await.unwrap();
    b.wait()
        .at_most(Duration::from_secs(10))
        .for_element(Locator::Css(r#"figure[data-series="moves"]"#))
        .await
        .unwrap();
    screenshot(&b, "history.png").await;
    b.close().await.unwrap();
}
