//! A private high-availability deployment: a primary, its replicas (one by
//! default) and three Sentinels on free loopback ports, with fast failure
//! detection, so tests can kill the primary and watch Sentinel promote a
//! replica.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::Error;
use crate::server::{RedisServer, ServerOptions, redis_server_binary};

/// The service name the Sentinels monitor.
pub const SERVICE_NAME: &str = "flotilla";

/// How long the deployment may take to be ready (replica in sync, every
/// Sentinel knowing the replica and the other Sentinels).
const READY_DEADLINE: Duration = Duration::from_secs(30);

/// Timings of the Sentinels (see [`Sentinels::start_with`]).
#[derive(Debug, Clone)]
pub struct SentinelOptions {
    /// `sentinel down-after-milliseconds`: how long the primary may be
    /// silent before a Sentinel thinks it down. Default: 1 s.
    pub down_after: Duration,
    /// `sentinel failover-timeout`. Default: 3 s.
    pub failover_timeout: Duration,
    /// Options of the Redis servers (all but the first are made replicas
    /// of the first with `REPLICAOF`). Default: no persistence.
    pub server: ServerOptions,
    /// How many replicas the primary has. Default: 1.
    pub replicas: usize,
    /// `min-replicas-to-write` and `min-replicas-max-lag` (seconds) of
    /// every server (`CONFIG SET`, again after a restart): a primary with
    /// fewer replicas that acknowledged within the lag refuses writes, as
    /// a primary that woke after its failover then does. Default: `None`
    /// (Redis's default: no such check).
    pub min_replicas: Option<(u32, u32)>,
}

impl Default for SentinelOptions {
    fn default() -> Self {
        SentinelOptions {
            down_after: Duration::from_secs(1),
            failover_timeout: Duration::from_secs(3),
            server: ServerOptions::default(),
            replicas: 1,
            min_replicas: None,
        }
    }
}

/// A primary, its replicas and three Sentinels (quorum 2), all killed on drop.
///
/// ```no_run
/// # async fn demo() -> Result<(), flotilla_testkit::Error> {
/// let mut ha = flotilla_testkit::Sentinels::start()?;
/// let url = ha.url(); // redis-sentinel://127.0.0.1:P1?sentinelServiceName=flotilla&node=…
/// let old = ha.kill_primary()?;
/// let new = ha.wait_for_failover(old, std::time::Duration::from_secs(20))?;
/// # let _ = (url, new); Ok(()) }
/// ```
#[derive(Debug)]
pub struct Sentinels {
    options: SentinelOptions,
    servers: Vec<RedisServer>,
    sentinels: Vec<SentinelProcess>,
    /// Sentinels started by [`Sentinels::start_stale_sentinel`].
    stale: Vec<SentinelProcess>,
    dir: tempfile::TempDir,
}

#[derive(Debug)]
struct SentinelProcess {
    port: u16,
    child: Child,
    // Held for the Sentinel's life, as a server's.
    _lease: crate::ports::PortLease,
}

impl Sentinels {
    /// Starts the deployment with the default (fast) timings.
    ///
    /// # Errors
    /// [`Error::RedisServerMissing`] when neither `redis-sentinel` nor
    /// `redis-server` is installed (the message says how to install it),
    /// [`Error::Startup`] when a process does not start or the deployment is
    /// not ready in time.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(SentinelOptions::default())
    }

    /// Starts the deployment with `options`.
    ///
    /// # Errors
    /// As [`Sentinels::start`].
    pub fn start_with(options: SentinelOptions) -> Result<Self, Error> {
        let binary = sentinel_binary()?;
        let dir = tempfile::Builder::new()
            .prefix("flotilla-sentinel-")
            .tempdir()
            .map_err(|e| Error::Startup(format!("cannot create a temp dir: {e}")))?;
        let primary = RedisServer::start_with(options.server.clone())?;
        let mut servers = vec![primary];
        for _ in 0..options.replicas.max(1) {
            let replica = RedisServer::start_with(options.server.clone())?;
            raw_command(
                replica.port(),
                &["REPLICAOF", "127.0.0.1", &servers[0].port().to_string()],
            );
            servers.push(replica);
        }
        let mut me = Sentinels {
            options,
            servers,
            sentinels: Vec::new(),
            stale: Vec::new(),
            dir,
        };
        for server in &me.servers {
            me.apply_min_replicas(server.port());
        }
        me.wait(READY_DEADLINE, "the replicas in sync", |me| {
            me.servers[1..].iter().all(|r| {
                info_field(r.port(), "replication", "master_link_status").as_deref() == Some("up")
            })
        })?;
        let primary_port = me.servers[0].port();
        for i in 0..3 {
            let sentinel = me.spawn_sentinel(&binary, i, primary_port)?;
            me.sentinels.push(sentinel);
        }
        me.wait(
            READY_DEADLINE,
            "every sentinel knows the replica and the others",
            |me| {
                me.sentinels.iter().all(|s| {
                    let master = raw_command(s.port, &["SENTINEL", "MASTER", SERVICE_NAME]);
                    field_after(&master, "num-slaves") == Some((me.servers.len() - 1).to_string())
                        && field_after(&master, "num-other-sentinels") == Some("2".into())
                })
            },
        )?;
        Ok(me)
    }

    /// The Sentinel URL of the deployment, for `Node::connect` or
    /// `fred::prelude::Config::from_url`.
    pub fn url(&self) -> String {
        let mut url = format!(
            "redis-sentinel://127.0.0.1:{}?sentinelServiceName={SERVICE_NAME}",
            self.sentinels[0].port
        );
        for s in &self.sentinels[1..] {
            url.push_str(&format!("&node=127.0.0.1:{}", s.port));
        }
        url
    }

    /// The port of the primary as the Sentinels report it, if a majority
    /// of them agree.
    pub fn primary_port(&self) -> Option<u16> {
        let answers: Vec<u16> = self
            .sentinels
            .iter()
            .filter_map(|s| {
                let reply = raw_command(
                    s.port,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE_NAME],
                );
                reply.lines().filter_map(|l| l.parse::<u16>().ok()).next()
            })
            .collect();
        answers
            .iter()
            .copied()
            .find(|p| answers.iter().filter(|q| *q == p).count() >= 2)
    }

    /// A plain `redis://` URL of the current primary, if known.
    pub fn primary_url(&self) -> Option<String> {
        self.primary_port()
            .map(|p| format!("redis://127.0.0.1:{p}"))
    }

    /// Steps the wall clock of every server and Sentinel by `by_ms`
    /// milliseconds, as a step of their host's clock would (see
    /// [`RedisServer::shift_clock`](crate::RedisServer::shift_clock)). A
    /// step over 2 s puts the Sentinels in TILT mode for 30 s, during
    /// which they fail nothing over ([`kill_primary`](Self::kill_primary)
    /// waits that out).
    ///
    /// # Errors
    /// [`Error::Startup`] when not started with
    /// [`ServerOptions::clock_shift`](crate::ServerOptions::clock_shift).
    pub fn shift_clock(&self, by_ms: i64) -> Result<(), Error> {
        for server in &self.servers {
            server.shift_clock(by_ms)?;
        }
        let file = crate::clock_shift::offset_file(self.dir.path())?;
        let now = crate::clock_shift::read_offset(&file)?;
        crate::clock_shift::write_offset(&file, now.saturating_add(by_ms.saturating_mul(1000)))
    }

    /// Kills the current primary with `SIGKILL` and returns its port,
    /// first waiting until no Sentinel is in TILT mode (see
    /// [`in_tilt`](Self::in_tilt)). A primary killed during a TILT is
    /// never failed over: the Sentinels find it down only once the TILT
    /// ends, and by then the replica's link has been down for longer than
    /// they accept of a replica to promote (ten `down_after` periods past
    /// the time they have known the primary down), which a chaos soak's
    /// failover ran into after its host's clock jumped 33 s.
    ///
    /// # Errors
    /// [`Error::Startup`] when no primary is known, [`Error::Timeout`]
    /// when a TILT lasts over 35 s.
    pub fn kill_primary(&mut self) -> Result<u16, Error> {
        self.wait(TILT_PERIOD, "the Sentinels out of TILT mode", |me| {
            !me.in_tilt()
        })?;
        let port = self
            .primary_port()
            .ok_or_else(|| Error::Startup("the sentinels agree on no primary".into()))?;
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.port() == port)
            .ok_or_else(|| Error::Startup(format!("no server of ours on port {port}")))?;
        server.kill();
        Ok(port)
    }

    /// Waits until the Sentinels name a primary other than `old` and that
    /// server answers as a primary; returns its port.
    ///
    /// # Errors
    /// [`Error::Timeout`] past `deadline`; the message says when a
    /// Sentinel is in TILT mode.
    pub fn wait_for_failover(&self, old: u16, deadline: Duration) -> Result<u16, Error> {
        let mut found = None;
        self.wait(deadline, "a replica promoted by the sentinels", |me| {
            found = me.primary_port().filter(|p| {
                *p != old && info_field(*p, "replication", "role").as_deref() == Some("master")
            });
            found.is_some()
        })?;
        found.ok_or_else(|| Error::Timeout(deadline, "a promoted replica".into()))
    }

    /// Starts the server on `port` again after [`kill_primary`](Self::kill_primary)
    /// (empty without persistence) and waits until it is a replica of the
    /// current primary in sync, so that the next failover has a replica.
    ///
    /// # Errors
    /// As [`RedisServer::start_again`], and [`Error::Timeout`] when it does
    /// not become an in-sync replica within `deadline`.
    pub fn restart_as_replica(&mut self, port: u16, deadline: Duration) -> Result<(), Error> {
        let server = self
            .servers
            .iter_mut()
            .find(|s| s.port() == port)
            .ok_or_else(|| Error::Startup(format!("no server of ours on port {port}")))?;
        server.start_again()?;
        self.apply_min_replicas(port);
        // Sentinel would convert it after a while; telling it at once keeps
        // the window where it answers as an empty primary short.
        self.wait_for_replica(port, deadline, Duration::ZERO)
    }

    /// Sets [`SentinelOptions::min_replicas`] on the server on `port`.
    fn apply_min_replicas(&self, port: u16) {
        if let Some((count, lag)) = self.options.min_replicas {
            raw_command(
                port,
                &[
                    "CONFIG",
                    "SET",
                    "min-replicas-to-write",
                    &count.to_string(),
                    "min-replicas-max-lag",
                    &lag.to_string(),
                ],
            );
        }
    }

    /// The OS process id of the server on `port`, when it is one of this
    /// deployment's and runs: for a test that freezes the primary
    /// (`SIGSTOP`) so that the Sentinels fail it over while its clients'
    /// connections stay open.
    pub fn server_pid(&self, port: u16) -> Option<u32> {
        self.servers
            .iter()
            .find(|s| s.port() == port)
            .and_then(RedisServer::pid)
    }

    /// Waits until the server on `port` is a replica of the current
    /// primary, in sync, and every Sentinel counts a replica. A primary
    /// that was frozen across a failover runs on as a primary when it
    /// wakes, until a Sentinel converts it (several seconds later); past
    /// `tell_after` the server is told itself (`REPLICAOF`), and again
    /// every 5 s while it does not sync (a Sentinel's reconfiguration may
    /// cross it). The current primary is the one the Sentinels name at
    /// each look, not at the start: they may fail over again meanwhile
    /// (a just-promoted server slow to answer for a moment), and telling
    /// the server to follow the one they had named made it replicate from
    /// a replica, undone by the Sentinels and redone by this wait every
    /// 5 s until the deadline (chaos soak seeds 1546 and 1548). A
    /// failover back to the server on `port` ends the wait too, once the
    /// Sentinels count a replica of it.
    ///
    /// # Errors
    /// [`Error::Startup`] when no primary is known, [`Error::Timeout`]
    /// when it is not an in-sync replica within `deadline`.
    pub fn wait_for_replica(
        &self,
        port: u16,
        deadline: Duration,
        tell_after: Duration,
    ) -> Result<(), Error> {
        self.primary_port()
            .ok_or_else(|| Error::Startup("the sentinels agree on no primary".into()))?;
        let began = Instant::now();
        let mut told: Option<Instant> = None;
        let waited = self.wait(
            deadline,
            "the old primary back as an in-sync replica",
            |me| {
                // Between two failovers the Sentinels may agree on none.
                let Some(primary) = me.primary_port() else {
                    return false;
                };
                if primary == port {
                    // Failed over back to it meanwhile: it is the primary
                    // again, and the deployment has its replica elsewhere.
                    return info_field(port, "replication", "role").as_deref() == Some("master")
                        && me.every_sentinel_counts_a_replica();
                }
                let primary = primary.to_string();
                let link = info_field(port, "replication", "master_link_status");
                let synced = link.as_deref() == Some("up")
                    && info_field(port, "replication", "master_port").as_deref()
                        == Some(primary.as_str());
                let tell = match told {
                    None => began.elapsed() >= tell_after,
                    Some(at) => at.elapsed() > Duration::from_secs(5),
                };
                if !synced && tell {
                    raw_command(port, &["REPLICAOF", "127.0.0.1", &primary]);
                    told = Some(Instant::now());
                }
                synced && me.every_sentinel_counts_a_replica()
            },
        );
        waited.map_err(|e| match e {
            Error::Timeout(d, what) => {
                Error::Timeout(d, format!("{what} ({})", self.replication_report(port)))
            }
            other => other,
        })
    }

    /// Whether every Sentinel counts at least one replica of the primary
    /// it names.
    fn every_sentinel_counts_a_replica(&self) -> bool {
        self.sentinels.iter().all(|s| {
            let master = raw_command(s.port, &["SENTINEL", "MASTER", SERVICE_NAME]);
            field_after(&master, "num-slaves").is_some_and(|n| n != "0")
        })
    }

    /// What the server on `port` and each Sentinel say about replication,
    /// and the last lines of the Sentinels' logs: the detail of a timeout.
    fn replication_report(&self, port: u16) -> String {
        let field = |name| info_field(port, "replication", name).unwrap_or_else(|| "-".into());
        let mut report = format!(
            "server {port}: role {}, master_port {}, master_link_status {}, master_sync_in_progress {}; sentinels' primary {:?}",
            field("role"),
            field("master_port"),
            field("master_link_status"),
            field("master_sync_in_progress"),
            self.primary_port(),
        );
        for (i, s) in self.sentinels.iter().enumerate() {
            let master = raw_command(s.port, &["SENTINEL", "MASTER", SERVICE_NAME]);
            let log = std::fs::read_to_string(self.dir.path().join(format!("sentinel-{i}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(4).collect();
            report.push_str(&format!(
                "; sentinel {i}: port {:?}, num-slaves {:?}, flags {:?}, log tail {:?}",
                field_after(&master, "port"),
                field_after(&master, "num-slaves"),
                field_after(&master, "flags"),
                tail,
            ));
        }
        report
    }

    /// Starts one more Sentinel that takes the replica for the primary (the
    /// view of a Sentinel that missed a failover) and returns its port. It
    /// stays stale: alone it cannot reach the quorum of 2 to fail its
    /// "primary" over, the others do not see that server down, and its
    /// configuration epoch equals theirs, so their announcements do not
    /// correct it. It is not part of [`url`](Self::url).
    ///
    /// # Errors
    /// [`Error::Startup`] when no primary is known or the Sentinel does not
    /// start; [`Error::Timeout`] when it does not name the replica in time.
    pub fn start_stale_sentinel(&mut self) -> Result<u16, Error> {
        let primary = self
            .primary_port()
            .ok_or_else(|| Error::Startup("the sentinels agree on no primary".into()))?;
        let replica = self
            .servers
            .iter()
            .map(RedisServer::port)
            .find(|p| *p != primary)
            .ok_or_else(|| Error::Startup("no replica".into()))?;
        let index = self.sentinels.len() + self.stale.len();
        let sentinel = self.spawn_sentinel(&sentinel_binary()?, index, replica)?;
        let port = sentinel.port;
        self.stale.push(sentinel);
        self.wait(
            READY_DEADLINE,
            "the stale sentinel names the replica",
            |_| {
                let reply =
                    raw_command(port, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE_NAME]);
                reply.lines().any(|l| l == replica.to_string())
            },
        )?;
        Ok(port)
    }

    /// The OS process id of the Sentinel on `port` (one of
    /// [`sentinel_ports`](Self::sentinel_ports)): for a test that freezes
    /// a Sentinel (`SIGSTOP`), whose clients' questions then go unanswered
    /// on open connections.
    pub fn sentinel_pid(&self, port: u16) -> Option<u32> {
        self.sentinels
            .iter()
            .chain(&self.stale)
            .find(|s| s.port == port)
            .map(|s| s.child.id())
    }

    /// The ports of the Sentinels.
    pub fn sentinel_ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    /// The Sentinels' timings.
    pub fn options(&self) -> &SentinelOptions {
        &self.options
    }

    fn spawn_sentinel(
        &self,
        binary: &Path,
        index: usize,
        primary_port: u16,
    ) -> Result<SentinelProcess, Error> {
        let mut last_error = String::new();
        for _ in 0..5 {
            let lease = crate::ports::lease_port()?;
            let port = lease.port();
            let conf = self.dir.path().join(format!("sentinel-{index}.conf"));
            let o = &self.options;
            let text = format!(
                "port {port}\nbind 127.0.0.1\nprotected-mode no\ndaemonize no\n\
                 dir {dir}\nlogfile {dir}/sentinel-{index}.log\n\
                 sentinel monitor {SERVICE_NAME} 127.0.0.1 {primary_port} 2\n\
                 sentinel down-after-milliseconds {SERVICE_NAME} {down}\n\
                 sentinel failover-timeout {SERVICE_NAME} {failover}\n\
                 sentinel parallel-syncs {SERVICE_NAME} 1\n",
                dir = self.dir.path().display(),
                down = o.down_after.as_millis(),
                failover = o.failover_timeout.as_millis(),
            );
            std::fs::write(&conf, text)
                .map_err(|e| Error::Startup(format!("cannot write {}: {e}", conf.display())))?;
            let mut cmd = Command::new(binary);
            cmd.arg(&conf);
            if binary.file_name().is_some_and(|n| n == "redis-server") {
                cmd.arg("--sentinel");
            }
            if o.server.clock_shift {
                cmd.env("LD_PRELOAD", crate::clock_shift::library()?).env(
                    "FLOTILLA_CLOCK_SHIFT_FILE",
                    crate::clock_shift::offset_file(self.dir.path())?,
                );
            }
            let mut child = cmd
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| Error::Startup(format!("cannot run {}: {e}", binary.display())))?;
            let started = Instant::now();
            loop {
                if let Ok(Some(status)) = child.try_wait() {
                    last_error = format!("sentinel on port {port} exited with {status}");
                    break;
                }
                match crate::server::answering_pid(port) {
                    Some(pid) if pid == child.id() => {
                        return Ok(SentinelProcess {
                            port,
                            child,
                            _lease: lease,
                        });
                    }
                    Some(pid) => {
                        let _ = child.kill();
                        let _ = child.wait();
                        last_error = format!("port {port} is held by another server (pid {pid})");
                        break;
                    }
                    None => {}
                }
                if started.elapsed() > Duration::from_secs(10) {
                    let _ = child.kill();
                    let _ = child.wait();
                    last_error = format!("sentinel on port {port} did not answer PING");
                    break;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        Err(Error::Startup(last_error))
    }

    fn wait(
        &self,
        deadline: Duration,
        what: &str,
        mut check: impl FnMut(&Self) -> bool,
    ) -> Result<(), Error> {
        let end = Instant::now() + deadline;
        loop {
            if check(self) {
                return Ok(());
            }
            if Instant::now() > end {
                let why = if self.in_tilt() {
                    format!("{what} (a Sentinel is in TILT mode: its host's clock stepped)")
                } else {
                    what.to_string()
                };
                return Err(Error::Timeout(deadline, why));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether a Sentinel is in TILT mode (`INFO sentinel`): it saw its
    /// host's wall clock step (an NTP step, a resumed virtual machine) and
    /// acts on nothing for 30 s.
    pub fn in_tilt(&self) -> bool {
        self.sentinels
            .iter()
            .any(|s| info_field(s.port, "sentinel", "sentinel_tilt").as_deref() == Some("1"))
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for s in self.sentinels.iter_mut().chain(self.stale.iter_mut()) {
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        crate::kept_logs::keep_logs_of(self.dir.path());
    }
}

/// `redis-sentinel` on `PATH` (Debian's package), else `redis-server`
/// (run with `--sentinel`), else an error that says how to install it.
///
/// # Errors
/// [`Error::RedisServerMissing`] when neither is installed.
pub fn sentinel_binary() -> Result<PathBuf, Error> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        let candidate = dir.join("redis-sentinel");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    redis_server_binary()
}

/// Sends one command in RESP and returns the reply as text lines (bulk
/// strings and integers without their RESP prefixes); empty on failure.
fn raw_command(port: u16, args: &[&str]) -> String {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(200))
    else {
        return String::new();
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(300)));
    let mut request = format!("*{}\r\n", args.len());
    for a in args {
        request.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    if stream.write_all(request.as_bytes()).is_err() {
        return String::new();
    }
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    // Read until the peer is quiet: replies here are small.
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 {
            break;
        }
        out.extend_from_slice(&buf[..n]);
        if n < buf.len() {
            break;
        }
    }
    String::from_utf8_lossy(&out)
        .lines()
        .filter(|l| !l.starts_with('*') && !l.starts_with('$'))
        .map(|l| l.trim_start_matches([':', '+']))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The value following `name` in a flat name/value reply.
fn field_after(reply: &str, name: &str) -> Option<String> {
    let mut lines = reply.lines();
    while let Some(l) = lines.next() {
        if l == name {
            return lines.next().map(str::to_string);
        }
    }
    None
}

/// One field of `INFO section` of the server on `port`.
/// How long a Sentinel stays in TILT mode after its clock stepped, and a
/// margin.
const TILT_PERIOD: Duration = Duration::from_secs(35);

fn info_field(port: u16, section: &str, field: &str) -> Option<String> {
    let info = raw_command(port, &["INFO", section]);
    info.lines().find_map(|l| {
        l.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_string())
    })
}
