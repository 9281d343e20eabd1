//! A TCP proxy on loopback that can cut, heal and black-hole connections,
//! for partition tests.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
    /// A one-way failure: the client's bytes reach the server, the
    /// server's are held (new connections are made the same way). Commands
    /// run and their replies never come; when the mode changes, what was
    /// held arrives, late and in order (TCP retransmitting once the route
    /// is back).
    Deaf,
    /// Forward bytes both ways, each delivered this long after it was read
    /// (a slow link: a round trip takes twice the delay). Bytes keep their
    /// order; a later change of mode applies to bytes read after it.
    Delay(Duration),
}

/// The state every connection watches: a mode for all of them, or for
/// one (`only`: its id) while the others forward.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    mode: ProxyMode,
    only: Option<u64>,
}

impl Link {
    /// The mode connection `id` follows.
    fn mode_of(self, id: u64) -> ProxyMode {
        match self.only {
            Some(only) if only != id => ProxyMode::Forward,
            _ => self.mode,
        }
    }
}

/// The ids of the connections being forwarded (or held).
type Open = Arc<Mutex<BTreeSet<u64>>>;

/// A loopback TCP proxy in front of one upstream address.
///
/// Dropping it stops the proxy and closes every connection.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    link: Arc<watch::Sender<Link>>,
    open: Open,
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
        let (tx, _) = watch::channel(Link {
            mode: ProxyMode::Forward,
            only: None,
        });
        let link = Arc::new(tx);
        let open = Open::default();
        let task = tokio::spawn(accept_loop(listener, upstream, link.clone(), open.clone()));
        Ok(FaultProxy {
            addr,
            link,
            open,
            task,
        })
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
        self.link.send_replace(Link { mode, only: None });
    }

    /// The ids of the connections open through the proxy now, oldest
    /// first (a client's connections in the order it opened them).
    pub fn connections(&self) -> Vec<u64> {
        self.open
            .lock()
            .map(|open| open.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Puts connection `id` alone in `mode` (a partial failure: one of a
    /// client's connections fails while its others, and any it opens
    /// meanwhile, forward); [`heal`](Self::heal) or another mode ends it.
    pub fn set_mode_of(&self, id: u64, mode: ProxyMode) {
        self.link.send_replace(Link {
            mode,
            only: Some(id),
        });
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

    /// Lets commands through and holds the replies (a one-way failure).
    pub fn deafen(&self) {
        self.set_mode(ProxyMode::Deaf);
    }

    /// Slows the link: bytes read from now on arrive `delay` later, each
    /// way.
    pub fn slow_down(&self, delay: Duration) {
        self.set_mode(ProxyMode::Delay(delay));
    }

    /// The current mode (of every connection, or of the one
    /// [`set_mode_of`](Self::set_mode_of) named).
    pub fn mode(&self) -> ProxyMode {
        self.link.borrow().mode
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
    link: Arc<watch::Sender<Link>>,
    open: Open,
) {
    let mut next_id = 0u64;
    loop {
        let Ok((mut client, _)) = listener.accept().await else {
            continue;
        };
        next_id += 1;
        let id = next_id;
        // A mode set for one connection never names a new one.
        let current = link.borrow().mode_of(id);
        match current {
            ProxyMode::Refuse | ProxyMode::Freeze => {
                let _ = client.shutdown().await;
                continue;
            }
            ProxyMode::Forward | ProxyMode::BlackHole | ProxyMode::Deaf | ProxyMode::Delay(_) => {}
        }
        let rx = link.subscribe();
        let open = open.clone();
        tokio::spawn(async move {
            let _registered = Registered::new(open, id);
            let _ = serve(client, upstream, id, rx).await;
        });
    }
}

/// A connection's entry in the open set, removed when it ends.
struct Registered {
    open: Open,
    id: u64,
}

impl Registered {
    fn new(open: Open, id: u64) -> Registered {
        if let Ok(mut set) = open.lock() {
            set.insert(id);
        }
        Registered { open, id }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        if let Ok(mut set) = self.open.lock() {
            set.remove(&self.id);
        }
    }
}

/// Bytes read from one side, and the moment they may be written to the
/// other (read time + the link's delay then).
type Chunk = (Instant, Vec<u8>);

async fn serve(
    client: TcpStream,
    upstream: SocketAddr,
    id: u64,
    mut mode: watch::Receiver<Link>,
) -> std::io::Result<()> {
    // In black-hole mode hold the connection open, silent, until the mode
    // changes; only then open the upstream side.
    loop {
        let current = mode.borrow_and_update().mode_of(id);
        match current {
            ProxyMode::Refuse => return Ok(()),
            ProxyMode::Forward | ProxyMode::Deaf | ProxyMode::Delay(_) => break,
            ProxyMode::BlackHole | ProxyMode::Freeze => {
                if mode.changed().await.is_err() {
                    return Ok(());
                }
            }
        }
    }
    let server = TcpStream::connect(upstream).await?;
    let (mut cr, cw) = client.into_split();
    let (mut sr, sw) = server.into_split();
    // One writer per direction delivers what was read in order, each chunk
    // no earlier than its due time, so a slow link delays bytes without
    // holding back the reads behind them (as a long wire would).
    let (to_server, server_queue) = mpsc::unbounded_channel::<Chunk>();
    let (to_client, client_queue) = mpsc::unbounded_channel::<Chunk>();
    let writers = Writers([
        tokio::spawn(deliver(server_queue, sw)),
        tokio::spawn(deliver(client_queue, cw)),
    ]);
    let mut cbuf = vec![0u8; 16 * 1024];
    let mut sbuf = vec![0u8; 16 * 1024];
    loop {
        let current = mode.borrow_and_update().mode_of(id);
        let delay = match current {
            ProxyMode::Refuse => return Ok(()),
            ProxyMode::BlackHole | ProxyMode::Freeze => {
                // Stop forwarding; keep both sockets open until it changes.
                // Bytes already on their way (a slow link's) still arrive.
                if mode.changed().await.is_err() {
                    return Ok(());
                }
                continue;
            }
            ProxyMode::Forward | ProxyMode::Deaf => Duration::ZERO,
            ProxyMode::Delay(delay) => delay,
        };
        // Deaf: the server's side is not read, so what it sends waits in
        // the socket buffers until the mode changes.
        let deaf = current == ProxyMode::Deaf;
        let (n, upstream_bound) = tokio::select! {
            changed = mode.changed() => {
                if changed.is_err() {
                    return Ok(());
                }
                continue;
            }
            n = cr.read(&mut cbuf) => (n?, true),
            n = sr.read(&mut sbuf), if !deaf => (n?, false),
        };
        if n == 0 {
            break;
        }
        let (queue, buf) = if upstream_bound {
            (&to_server, &cbuf)
        } else {
            (&to_client, &sbuf)
        };
        if queue
            .send((Instant::now() + delay, buf[..n].to_vec()))
            .is_err()
        {
            return Ok(());
        }
    }
    // One side closed: deliver what is still on its way, then close both.
    drop((to_server, to_client));
    writers.finish().await;
    Ok(())
}

/// Writes the chunks of `queue` to `out`, each at its due time.
async fn deliver(mut queue: mpsc::UnboundedReceiver<Chunk>, mut out: OwnedWriteHalf) {
    while let Some((due, bytes)) = queue.recv().await {
        tokio::time::sleep_until(due).await;
        if out.write_all(&bytes).await.is_err() {
            return;
        }
    }
}

/// A connection's two writer tasks: aborted when the connection is cut
/// (dropped), awaited when it closes.
struct Writers([JoinHandle<()>; 2]);

impl Writers {
    async fn finish(mut self) {
        for writer in &mut self.0 {
            let _ = writer.await;
        }
    }
}

impl Drop for Writers {
    fn drop(&mut self) {
        for writer in &self.0 {
            writer.abort();
        }
    }
}
