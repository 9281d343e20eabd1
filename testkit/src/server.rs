//! A private `redis-server` on a free loopback port.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;
use crate::ports::{PortLease, lease_port};

/// How long a fresh server may take to answer `PING`.
const STARTUP_DEADLINE: Duration = Duration::from_secs(15);

/// Options for [`RedisServer`].
#[derive(Debug, Clone, Default)]
pub struct ServerOptions {
    /// Turn on append-only-file persistence (in the server's temp dir), so a
    /// restart keeps the data. Default: `false` (no persistence at all).
    pub aof: bool,
    /// Extra `--name value` arguments passed to `redis-server`.
    /// Default: none.
    pub extra_args: Vec<(String, String)>,
    /// Fixed port; `None` picks a free loopback port. Default: `None`.
    pub port: Option<u16>,
    /// Also listen for TLS on a second free port, with a self-signed
    /// certificate made by `openssl` for `127.0.0.1`/`localhost` (see
    /// [`RedisServer::tls_url`]). Default: `false`.
    pub tls: bool,
    /// Run the server with a wall clock that
    /// [`RedisServer::shift_clock`] can step forward or back while it runs
    /// (see [`crate::clock_shift`]). Default: `false`.
    pub clock_shift: bool,
}

impl ServerOptions {
    /// Turns append-only-file persistence on or off.
    pub fn aof(mut self, on: bool) -> Self {
        self.aof = on;
        self
    }

    /// Adds a `--name value` argument for `redis-server`.
    pub fn arg(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.extra_args.push((name.into(), value.into()));
        self
    }

    /// Uses a fixed port instead of a free one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    /// Turns the TLS port on or off.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = on;
        self
    }

    /// Turns the steppable wall clock on or off.
    pub fn clock_shift(mut self, on: bool) -> Self {
        self.clock_shift = on;
        self
    }
}

/// A private `redis-server` process, killed when dropped.
///
/// The server listens on `127.0.0.1` only, on a port reserved for it until
/// it is dropped (no other testkit server, in any process, takes it while
/// this one is down for a restart), and keeps its data directory in a temp
/// dir that lives as long as this value, so [`RedisServer::restart`] brings
/// back the same server (same port, same data when AOF is on).
#[derive(Debug)]
pub struct RedisServer {
    options: ServerOptions,
    port: u16,
    tls_port: Option<u16>,
    // The ports stay this server's while it is down between restarts.
    port_leases: Vec<PortLease>,
    dir: tempfile::TempDir,
    child: Option<Child>,
}

impl RedisServer {
    /// Starts a server with no persistence.
    ///
    /// # Errors
    /// [`Error::RedisServerMissing`] when `redis-server` is not on `PATH`
    /// (the message says how to install it), [`Error::Startup`] when it does
    /// not answer `PING` in time.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(ServerOptions::default())
    }

    /// Starts a server with the given options.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_with(options: ServerOptions) -> Result<Self, Error> {
        let binary = redis_server_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("flotilla-redis-")
            .tempdir()
            .map_err(|e| Error::Startup(format!("cannot create a temp dir: {e}")))?;
        let mut port_leases = Vec::new();
        let tls_port = if options.tls {
            crate::tls::make_certificate(dir.path())?;
            let lease = lease_port()?;
            let port = lease.port();
            port_leases.push(lease);
            Some(port)
        } else {
            None
        };
        let mut server = RedisServer {
            options,
            port: 0,
            tls_port,
            port_leases,
            dir,
            child: None,
        };
        let mut last_error = String::new();
        // A port can still be taken by a program that is not a testkit
        // server before this one binds it: retry with another.
        for _ in 0..5 {
            server.port = match server.options.port {
                Some(p) => p,
                None => {
                    let lease = lease_port()?;
                    let port = lease.port();
                    server.port_leases.push(lease);
                    port
                }
            };
            match server.spawn(&binary) {
                Ok(()) => {
                    if let Some(tls_port) = server.tls_port {
                        crate::tls::register(tls_port, server.dir.path());
                    }
                    return Ok(server);
                }
                Err(e) => {
                    last_error = e.to_string();
                    if server.options.port.is_some() {
                        break;
                    }
                    // The port this try leased is given back.
                    server.port_leases.pop();
                }
            }
        }
        Err(Error::Startup(last_error))
    }

    /// The server's port on `127.0.0.1`.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    /// A `redis://` URL for the server.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// A `rediss://` URL for the server's TLS port, when started with
    /// [`ServerOptions::tls`]. [`crate::client`] and [`crate::builder`]
    /// trust the server's certificate for this URL.
    pub fn tls_url(&self) -> Option<String> {
        self.tls_port.map(|p| format!("rediss://127.0.0.1:{p}"))
    }

    /// The PEM file of the test CA that signed the TLS certificate, when
    /// started with [`ServerOptions::tls`] (for clients other than
    /// [`crate::client`], e.g. a command-line tool's `--tls-ca`).
    pub fn tls_ca_file(&self) -> Option<PathBuf> {
        self.tls_port
            .map(|_| self.dir.path().join(crate::tls::CA_FILE))
    }

    /// The server's data directory.
    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    /// Steps the server's wall clock by `by_ms` milliseconds (forward when
    /// positive) from where it is now, at once, as an NTP step or a resumed
    /// virtual machine would: `TIME`, scripts and key expiry see the new
    /// time; the monotonic clock does not move. The offset stays across
    /// restarts.
    ///
    /// # Errors
    /// [`Error::Startup`] when the server was not started with
    /// [`ServerOptions::clock_shift`] or the offset file cannot be written.
    pub fn shift_clock(&self, by_ms: i64) -> Result<(), Error> {
        if !self.options.clock_shift {
            return Err(Error::Startup(
                "shift_clock needs a server started with ServerOptions::clock_shift".into(),
            ));
        }
        let file = crate::clock_shift::offset_file(self.dir.path())?;
        let now = crate::clock_shift::read_offset(&file)?;
        crate::clock_shift::write_offset(&file, now.saturating_add(by_ms.saturating_mul(1000)))
    }

    /// The OS process id of the running server, if it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Freezes the server (`SIGSTOP`), as a stalled host or a paused
    /// virtual machine would: its connections stay open and nothing is
    /// answered until [`thaw`](Self::thaw).
    ///
    /// # Errors
    /// [`Error::Startup`] when the server does not run or cannot be
    /// signalled.
    pub fn freeze(&self) -> Result<(), Error> {
        self.signal(nix::sys::signal::Signal::SIGSTOP)
    }

    /// Lets a [frozen](Self::freeze) server run on (`SIGCONT`).
    ///
    /// # Errors
    /// As [`freeze`](Self::freeze).
    pub fn thaw(&self) -> Result<(), Error> {
        self.signal(nix::sys::signal::Signal::SIGCONT)
    }

    fn signal(&self, signal: nix::sys::signal::Signal) -> Result<(), Error> {
        let pid = self
            .pid()
            .ok_or_else(|| Error::Startup("the server does not run".into()))?;
        let pid = i32::try_from(pid).map_err(|e| Error::Startup(e.to_string()))?;
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal)
            .map_err(|e| Error::Startup(format!("{signal} to redis-server {pid}: {e}")))
    }

    /// Whether the server process is running.
    pub fn is_running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(child) => matches!(child.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Kills the server (`SIGKILL`), as a crash would. Data not yet written
    /// to the AOF is lost; without AOF everything is lost.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the server and starts it again on the same port with the same
    /// data directory (so with AOF the data survives).
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn restart(&mut self) -> Result<(), Error> {
        self.kill();
        self.start_again()
    }

    /// Kills the server and starts it again on the same port with its data
    /// gone (AOF and RDB files removed): a restart without persistence, or
    /// a failover to an empty replica.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn restart_empty(&mut self) -> Result<(), Error> {
        self.kill();
        let dir = self.data_dir().to_path_buf();
        let _ = std::fs::remove_dir_all(dir.join("appendonlydir"));
        let _ = std::fs::remove_file(dir.join("dump.rdb"));
        self.start_again()
    }

    /// Starts a server that was [`kill`](RedisServer::kill)ed, on the same
    /// port and data directory.
    ///
    /// # Errors
    /// As [`RedisServer::start`].
    pub fn start_again(&mut self) -> Result<(), Error> {
        if self.is_running() {
            return Ok(());
        }
        let binary = redis_server_binary()?;
        // The old socket may linger briefly in the kernel; retry the bind.
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            match self.spawn(&binary) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!(error = %e, "redis-server restart failed, retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(e),
            }
        }
    }

    fn spawn(&mut self, binary: &Path) -> Result<(), Error> {
        let mut cmd = Command::new(binary);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--save")
            .arg("")
            .arg("--daemonize")
            .arg("no")
            .arg("--protected-mode")
            .arg("no")
            .arg("--loglevel")
            .arg(crate::kept_logs::server_log_level())
            .arg("--logfile")
            .arg(self.dir.path().join("redis.log"));
        if let Some(tls_port) = self.tls_port {
            let dir = self.dir.path();
            cmd.arg("--tls-port")
                .arg(tls_port.to_string())
                .arg("--tls-cert-file")
                .arg(dir.join(crate::tls::CERT_FILE))
                .arg("--tls-key-file")
                .arg(dir.join(crate::tls::KEY_FILE))
                .arg("--tls-ca-cert-file")
                .arg(dir.join(crate::tls::CA_FILE))
                .arg("--tls-auth-clients")
                .arg("no");
        }
        if self.options.aof {
            cmd.arg("--appendonly")
                .arg("yes")
                .arg("--appendfsync")
                .arg("always");
        } else {
            cmd.arg("--appendonly").arg("no");
        }
        for (name, value) in &self.options.extra_args {
            cmd.arg(format!("--{name}")).arg(value);
        }
        if self.options.clock_shift {
            cmd.env("LD_PRELOAD", crate::clock_shift::library()?).env(
                "FLOTILLA_CLOCK_SHIFT_FILE",
                crate::clock_shift::offset_file(self.dir.path())?,
            );
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let mut child = cmd
            .spawn()
            .map_err(|e| Error::Startup(format!("cannot run {}: {e}", binary.display())))?;
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                let log =
                    std::fs::read_to_string(self.dir.path().join("redis.log")).unwrap_or_default();
                return Err(Error::Startup(format!(
                    "redis-server on port {} exited with {status}: {}",
                    self.port,
                    log.lines().rev().take(5).collect::<Vec<_>>().join(" | ")
                )));
            }
            match answering_pid(self.port) {
                // Ours, and done loading its data: a server restarted from
                // a snapshot answers INFO while it loads, and refuses most
                // commands (`-LOADING`) until it is done.
                Some(pid) if pid == child.id() && answers_ping(self.port) => {
                    self.child = Some(child);
                    return Ok(());
                }
                Some(pid) if pid == child.id() => {} // still loading
                Some(pid) => {
                    // Ours could not bind: never talk to another server.
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(Error::Startup(format!(
                        "port {} is held by another redis-server (pid {pid})",
                        self.port
                    )));
                }
                None => {}
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(Error::Startup(format!(
                    "redis-server on port {} did not answer PING within {:?}",
                    self.port, STARTUP_DEADLINE
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        crate::kept_logs::keep_logs_of(self.dir.path());
    }
}

/// Finds `redis-server` on `PATH`, or explains how to install it.
///
/// # Errors
/// [`Error::RedisServerMissing`] when it is not found.
pub fn redis_server_binary() -> Result<PathBuf, Error> {
    if let Some(path) = std::env::var_os("REDIS_SERVER_BIN") {
        return Ok(PathBuf::from(path));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("redis-server");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(Error::RedisServerMissing)
}

/// A free TCP port on the loopback interface, from the kernel's ephemeral
/// range and not held: for a listener the caller binds at once. A server
/// that restarts on its port should be a [`RedisServer`], whose ports stay
/// reserved.
///
/// # Errors
/// [`Error::Startup`] when no port can be bound.
pub fn free_port() -> Result<u16, Error> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| Error::Startup(format!("cannot bind a loopback port: {e}")))?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|e| Error::Startup(format!("cannot read the bound port: {e}")))
}

/// Whether the server on `port` answers `PING` with `PONG` (not `LOADING`).
fn answers_ping(port: u16) -> bool {
    crate::rollback::command(port, b"*1\r\n$4\r\nPING\r\n", b"+PONG").is_ok()
}

/// The process id of the server answering on `port` (`INFO server`), or
/// `None` when nothing answers yet. A server is ready once the answer is
/// its own process's: another one's means its port was taken.
pub(crate) fn answering_pid(port: u16) -> Option<u32> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .ok()?;
    let mut reply = Vec::new();
    let mut buf = [0u8; 4096];
    // The field is in the first kilobyte; read until its line is complete.
    while reply.len() < 64 * 1024 {
        let n = stream.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        reply.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&reply);
        if let Some(rest) = text.split("process_id:").nth(1)
            && let Some((pid, _)) = rest.split_once("\r\n")
        {
            return pid.trim().parse().ok();
        }
    }
    None
}
