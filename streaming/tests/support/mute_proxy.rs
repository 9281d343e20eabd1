//! An in-test TCP proxy in front of Redis that can hold back what Redis
//! sends on pub/sub connections (those that sent `SSUBSCRIBE`) while
//! command connections keep working: a client's replicated maps stop
//! hearing changes — their replicas lag — while its commands still run.
//! Held bytes are forwarded, in order, on [`MuteProxy::unmute`].

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// The proxy; dropping it closes every connection.
#[derive(Debug)]
pub struct MuteProxy {
    addr: SocketAddr,
    muted: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl MuteProxy {
    /// Starts forwarding from a free loopback port to `upstream`.
    pub async fn start(upstream: SocketAddr) -> MuteProxy {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (muted, _) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, upstream, muted.subscribe()));
        MuteProxy { addr, muted, task }
    }

    /// A `redis://` URL pointing at the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Holds back everything Redis sends on pub/sub connections.
    pub fn mute(&self) {
        self.muted.send_replace(true);
    }

    /// Forwards the held bytes and everything after them.
    pub fn unmute(&self) {
        self.muted.send_replace(false);
    }
}

impl Drop for MuteProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, muted: watch::Receiver<bool>) {
    // Dropping the set (when this task is aborted) ends every connection.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((client, _)) = accepted {
                    connections.spawn(serve(client, upstream, muted.clone()));
                }
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

async fn serve(client: TcpStream, upstream: SocketAddr, mut muted: watch::Receiver<bool>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (mut client_rx, mut client_tx) = client.into_split();
    let (mut server_rx, mut server_tx) = server.into_split();
    let subscriber = Arc::new(AtomicBool::new(false));
    let up = {
        let subscriber = subscriber.clone();
        async move {
            let mut buf = vec![0u8; 16 * 1024];
            while let Ok(n @ 1..) = client_rx.read(&mut buf).await {
                if contains_ignore_case(&buf[..n], b"SSUBSCRIBE") {
                    subscriber.store(true, Ordering::SeqCst);
                }
                if server_tx.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async move {
        let mut buf = vec![0u8; 16 * 1024];
        while let Ok(n @ 1..) = server_rx.read(&mut buf).await {
            if subscriber.load(Ordering::SeqCst) {
                // Hold this chunk (and so everything after it) while muted.
                let _ = muted.wait_for(|m| !*m).await;
            }
            if client_tx.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

fn contains_ignore_case(haystack: &[u8], needle: &[u8]) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w.eq_ignore_ascii_case(needle))
}
