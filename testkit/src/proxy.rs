//! A TCP proxy on loopback that can cut, heal and black-hole connections,
//! for partition tests.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::Error;

/// What the proxy does with traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyMode {
    /// Forward bytes both ways.
    Forward,
    /// Close every open connection and refuse new ones (accept and close at
    /// once), like a crashed peer.
    Refuse,
    /// Accept connections and keep them open, but never forward a byte in
    /// either direction: a TCP black hole.
    BlackHole,
    /// Keep open connections open but forward nothing on them, and refuse
    /// new ones: the peer's sockets freeze while reconnects fail at once.
    Freeze,
}

/// A loopback TCP proxy in front of one upstream address.
///
/// Dropping it stops the proxy and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    /// Must be called inside a tokio runtime.
    ///
    /// # Errors
    /// [`Error::Startup`] when the listener cannot be bound.
    pub async fn start(upstream: SocketAddr) -> Result<Self, Error> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| Error::Startup(format!("proxy bind: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Startup(format!("proxy addr: {e}")))?;
        let (tx, _) = watch::channel(ProxyMode::Forward);
        let mode = Arc::new(tx);
        let task = tokio::spawn(accept_loop(listener, upstream, mode.clone()));
        Ok(FaultProxy { addr, mode, task })
    }

    /// The proxy's listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A `redis://` URL pointing at the proxy.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Switches mode; existing connections follow at once.
    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    /// Cuts every connection and refuses new ones.
    pub fn cut(&self) {
        self.set_mode(ProxyMode::Refuse);
    }

    /// Stops forwarding without closing anything.
    pub fn black_hole(&self) {
        self.set_mode(ProxyMode::BlackHole);
    }

    /// Freezes open connections and refuses new ones.
    pub fn freeze(&self) {
        self.set_mode(ProxyMode::Freeze);
    }

    /// The current mode.
    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Forwards again.
    pub fn heal(&self) {
        self.set_mode(ProxyMode::Forward);
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.set_mode(ProxyMode::Refuse);
        self.task.abort();
    }
}

async fn accept_loop(
    listener: TcpListener,
    upstream: SocketAddr,
    mode: Arc<watch::Sender<ProxyMode>>,
) {
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        let current = *mode.borrow();
        match current {
            ProxyMode::Refuse | ProxyMode::Freeze => {
                let _ = client.shutdown().await;
                continue;
            }
            ProxyMode::Forward | ProxyMode::BlackHole => {}
        }
        let rx = mode.subscribe();
        tokio::spawn(async move {
            let _ = serve(client, upstream, rx).await;
        });
    }
}

async fn serve(
    mut client: TcpStream,
    upstream: SocketAddr,
    mut mode: watch::Receiver<ProxyMode>,
) -> std::io::Result<()> {
    // In black-hole mode hold the connection open, silent, until the mode
    // changes; only then open the upstream side.
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Refuse => return Ok(()),
            ProxyMode::Forward => break,
            ProxyMode::BlackHole | ProxyMode::Freeze => {
                if mode.changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }
    let mut server = TcpStream::connect(upstream).await?;
    let (mut cr, mut cw) = client.split();
    let (mut sr, mut sw) = server.split();
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut sbuf = vec![0u8; 16 * 1024];
    use tokio::io::AsyncReadExt;
    loop {
        let current = *mode.borrow_and_update();
        match current {
            ProxyMode::Refuse => return Ok(()),
            ProxyMode::BlackHole | ProxyMode::Freeze => {
                // Stop forwarding; keep both sockets open until it changes.
                if mode.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            }
            ProxyMode::Forward => {}
        }
        tokio::select! {
            changed = mode.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
            }
            n = cr.read(&mut cbuf) => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                sw.write_all(&cbuf[..n]).await?;
            }
            n = sr.read(&mut sbuf) => {
                let n = n?;
                if n == 0 {
                    return Ok(());
                }
                cw.write_all(&sbuf[..n]).await?;
            }
        }
    }
}
