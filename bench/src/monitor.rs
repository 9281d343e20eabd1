//! Counts the commands Redis executes during a window with `MONITOR`, split
//! into commands sent by clients (the critical path of a dispatch) and
//! commands run inside scripts. The window is delimited by two marker
//! `GET`s sent through the measured client, so counting is exact however
//! late the monitor stream arrives.

use std::collections::BTreeMap;

use fred::prelude::*;
use fred::types::config::ServerConfig;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::BoxError;

/// Commands seen between the two markers.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    /// Sent by a client, not blocking (script calls, plain commands).
    pub client: BTreeMap<String, u64>,
    /// Sent by a client, blocking reads (`XREAD … BLOCK`, `BLPOP`, …).
    pub blocking: BTreeMap<String, u64>,
    /// Run inside scripts.
    pub script: BTreeMap<String, u64>,
}

impl Counts {
    /// Sum of one of the maps.
    pub fn sum(map: &BTreeMap<String, u64>) -> u64 {
        map.values().sum()
    }

    /// `name per-unit, …` of one map, largest first, at most six entries.
    pub fn breakdown(map: &BTreeMap<String, u64>, per: f64) -> String {
        let mut entries: Vec<_> = map.iter().collect();
        entries.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        entries
            .into_iter()
            .take(6)
            .map(|(name, calls)| format!("{name} {:.2}", *calls as f64 / per))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A running `MONITOR` session.
#[derive(Debug)]
pub struct Monitor {
    marker: String,
    task: JoinHandle<Result<Counts, String>>,
}

/// One parsed monitor line.
#[derive(Debug, PartialEq, Eq)]
struct Line {
    in_script: bool,
    command: String,
    blocking: bool,
}

impl Monitor {
    /// Opens a raw connection to the server of `url`, runs `MONITOR`, and
    /// starts counting once the start marker sent through `client` shows up.
    ///
    /// # Errors
    /// When the URL is not a single server, or the connection fails.
    pub async fn start(url: &str, client: &Client) -> Result<Monitor, BoxError> {
        let config = Config::from_url(url)?;
        let ServerConfig::Centralized { server } = &config.server else {
            return Err("MONITOR counting needs a single (centralized) server URL".into());
        };
        let stream = TcpStream::connect((server.host.to_string(), server.port)).await?;
        let (read, mut write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        if let Some(password) = &config.password {
            let mut args = vec!["AUTH".to_string()];
            args.extend(config.username.clone());
            args.push(password.clone());
            write.write_all(&resp(&args)).await?;
            expect_ok(&mut lines).await?;
        }
        write.write_all(&resp(&["MONITOR".to_string()])).await?;
        expect_ok(&mut lines).await?;
        let marker = format!("fl:bench-marker:{}", uuid::Uuid::new_v4().simple());
        let (started_tx, started_rx) = oneshot::channel();
        let start_marker = format!("{marker}:start");
        let end_marker = format!("{marker}:end");
        let task = tokio::spawn(async move {
            let _write = write; // keep the connection open
            let mut started_tx = Some(started_tx);
            let mut counts = Counts::default();
            loop {
                let line = match lines.next_line().await {
                    Ok(Some(line)) => line,
                    Ok(None) => return Err("MONITOR connection closed".to_string()),
                    Err(e) => return Err(e.to_string()),
                };
                if line.contains(&start_marker) {
                    if let Some(tx) = started_tx.take() {
                        let _ = tx.send(());
                    }
                    continue;
                }
                if line.contains(&end_marker) {
                    return Ok(counts);
                }
                if started_tx.is_some() {
                    continue;
                }
                let Some(parsed) = parse_line(&line) else {
                    continue;
                };
                let map = if parsed.in_script {
                    &mut counts.script
                } else if parsed.blocking {
                    &mut counts.blocking
                } else {
                    &mut counts.client
                };
                *map.entry(parsed.command).or_default() += 1;
            }
        });
        let _: Option<String> = client.get(format!("{marker}:start")).await?;
        tokio::time::timeout(std::time::Duration::from_secs(10), started_rx)
            .await
            .map_err(|_| "MONITOR did not show the start marker")??;
        Ok(Monitor { marker, task })
    }

    /// Ends the window (end marker through `client`) and returns the counts.
    ///
    /// # Errors
    /// When the monitor connection failed.
    pub async fn finish(self, client: &Client) -> Result<Counts, BoxError> {
        let _: Option<String> = client.get(format!("{}:end", self.marker)).await?;
        let counts = tokio::time::timeout(std::time::Duration::from_secs(30), self.task)
            .await
            .map_err(|_| "MONITOR did not show the end marker")??;
        Ok(counts?)
    }
}

/// A RESP array of bulk strings.
fn resp(args: &[String]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n{a}\r\n", a.len()).into_bytes());
    }
    out
}

async fn expect_ok(
    lines: &mut tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
) -> Result<(), BoxError> {
    match lines.next_line().await? {
        Some(l) if l.trim_end() == "+OK" => Ok(()),
        other => Err(format!("unexpected reply {other:?}").into()),
    }
}

/// Parses `+1700000000.123456 [0 127.0.0.1:5000] "XREAD" "BLOCK" …` or
/// `… [0 lua] "hset" …`.
fn parse_line(line: &str) -> Option<Line> {
    let line = line.trim_end();
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let source = line[open + 1..close].split_whitespace().nth(1)?;
    let rest = line[close + 1..].trim_start();
    let rest = rest.strip_prefix('"')?;
    let command = rest[..rest.find('"')?].to_ascii_lowercase();
    let blocking = match command.as_str() {
        "xread" | "xreadgroup" => rest.to_ascii_lowercase().contains("\"block\""),
        "blpop" | "brpop" | "blmove" | "brpoplpush" | "bzpopmin" | "bzpopmax" | "blmpop"
        | "bzmpop" | "wait" => true,
        _ => false,
    };
    Some(Line {
        in_script: source == "lua",
        command,
        blocking,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_client_script_and_blocking_lines() {
        let l = parse_line(r#"+1700000000.123456 [0 127.0.0.1:5000] "EVALSHA" "abc" "8""#);
        assert_eq!(
            l,
            Some(Line {
                in_script: false,
                command: "evalsha".into(),
                blocking: false
            })
        );
        let l = parse_line(r#"+1700000000.1 [0 lua] "hset" "fl:{p}:map:jobs" "k" "v""#).unwrap();
        assert!(l.in_script);
        let l =
            parse_line(r#"+1.2 [0 127.0.0.1:1] "XREAD" "COUNT" "1000" "BLOCK" "5000""#).unwrap();
        assert!(l.blocking);
        let l =
            parse_line(r#"+1.2 [0 127.0.0.1:1] "XREAD" "COUNT" "10" "STREAMS" "s" "0""#).unwrap();
        assert!(!l.blocking);
        assert_eq!(parse_line("+OK"), None);
    }
}
