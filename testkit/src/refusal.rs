//! Redis refusing work while it keeps running and keeps its data: writes
//! refused (out of memory, or turned into a read-only replica), writes
//! held (a client pause), and every client's connection dropped at once. No data is lost in any of them; what
//! they test is that every background task takes an error reply or a
//! closed connection in its stride, and that nobody runs a job twice when
//! the writes that keep leases alive fail for a while.

use crate::rollback::command;
use crate::{Error, RedisServer, free_port};

/// How a running server refuses writes ([`RedisServer::refuse_writes`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteRefusal {
    /// `maxmemory` set below what the server uses (policy `noeviction`):
    /// every command and function that may add data gets an `OOM` error,
    /// while reads and deletions still run.
    OutOfMemory,
    /// The server made a replica of a primary that does not answer
    /// (`REPLICAOF` a closed loopback port): it keeps its data and serves
    /// reads, refuses every write with `READONLY`, and drops the blocking
    /// reads it was serving.
    ReadOnlyReplica,
}

impl WriteRefusal {
    /// Both kinds.
    pub const ALL: [WriteRefusal; 2] = [WriteRefusal::OutOfMemory, WriteRefusal::ReadOnlyReplica];
}

/// One RESP request made of `args`.
fn request(args: &[&str]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        out.extend_from_slice(format!("${}\r\n{arg}\r\n", arg.len()).as_bytes());
    }
    out
}

impl RedisServer {
    /// Makes the server refuse writes in the way `refusal` names, until
    /// [`RedisServer::accept_writes`]. A restart ends it too (both are
    /// runtime settings).
    ///
    /// # Errors
    /// [`Error::Startup`] when the server does not take the setting.
    pub fn refuse_writes(&self, refusal: WriteRefusal) -> Result<(), Error> {
        let port = self.port();
        match refusal {
            WriteRefusal::OutOfMemory => {
                command(port, &request(&["CONFIG", "SET", "maxmemory", "1"]), b"+OK")
            }
            WriteRefusal::ReadOnlyReplica => {
                // A port free a moment ago: nothing listens there, so the
                // replica never syncs and never replaces its data.
                let nowhere = free_port()?.to_string();
                command(
                    port,
                    &request(&["REPLICAOF", "127.0.0.1", &nowhere]),
                    b"+OK",
                )
            }
        }
    }

    /// Ends a [`RedisServer::refuse_writes`]: no `maxmemory`, or a primary
    /// again (`REPLICAOF NO ONE`, data kept).
    ///
    /// # Errors
    /// [`Error::Startup`] when the server does not take the setting.
    pub fn accept_writes(&self, refusal: WriteRefusal) -> Result<(), Error> {
        let args: &[&str] = match refusal {
            WriteRefusal::OutOfMemory => &["CONFIG", "SET", "maxmemory", "0"],
            WriteRefusal::ReadOnlyReplica => &["REPLICAOF", "NO", "ONE"],
        };
        command(self.port(), &request(args), b"+OK")
    }

    /// Holds every write for up to `limit_ms` (`CLIENT PAUSE <ms> WRITE`,
    /// what a `FAILOVER` or an operator's pause does), until
    /// [`RedisServer::unpause`]: a client's write command, and every
    /// function call, waits without an answer while reads, blocking reads
    /// and published messages go on; when the pause ends, the held
    /// commands run, late, in order. Keys do not expire meanwhile.
    ///
    /// # Errors
    /// [`Error::Startup`] when the server does not take the command.
    pub fn pause_writes(&self, limit_ms: u64) -> Result<(), Error> {
        let ms = limit_ms.to_string();
        command(
            self.port(),
            &request(&["CLIENT", "PAUSE", &ms, "WRITE"]),
            b"+OK",
        )
    }

    /// Ends a [`RedisServer::pause_writes`] (`CLIENT UNPAUSE`).
    ///
    /// # Errors
    /// [`Error::Startup`] when the server does not take the command.
    pub fn unpause(&self) -> Result<(), Error> {
        command(self.port(), &request(&["CLIENT", "UNPAUSE"]), b"+OK")
    }

    /// Closes the connection of every client but the one that asks
    /// (`CLIENT KILL TYPE normal`, then `pubsub`): as a proxy or load
    /// balancer in front of Redis restarting, or a server-side idle
    /// timeout. Commands in flight may or may not have run; subscribers
    /// miss what is published until they subscribe again.
    ///
    /// # Errors
    /// [`Error::Startup`] when a command fails.
    pub fn drop_clients(&self) -> Result<(), Error> {
        for kind in ["normal", "pubsub"] {
            command(
                self.port(),
                &request(&["CLIENT", "KILL", "TYPE", kind, "SKIPME", "yes"]),
                b":",
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerOptions;

    #[test]
    fn writes_are_refused_until_accepted_and_no_data_is_lost() {
        let server = RedisServer::start_with(ServerOptions::default())
            .expect("redis-server must be installed (apt-get install redis-server)");
        let port = server.port();
        command(port, &request(&["SET", "a", "kept"]), b"+OK").unwrap();
        for refusal in WriteRefusal::ALL {
            server.refuse_writes(refusal).unwrap();
            let expected: &[u8] = match refusal {
                WriteRefusal::OutOfMemory => b"-OOM",
                WriteRefusal::ReadOnlyReplica => b"-READONLY",
            };
            command(port, &request(&["SET", "b", "x"]), expected).unwrap();
            command(port, &request(&["GET", "a"]), b"$4\r\nkept").unwrap();
            server.accept_writes(refusal).unwrap();
            command(port, &request(&["SET", "b", "x"]), b"+OK").unwrap();
            command(port, &request(&["GET", "a"]), b"$4\r\nkept").unwrap();
        }
    }

    #[test]
    fn paused_writes_wait_while_reads_run_then_land() {
        use std::io::{Read, Write};
        let server = RedisServer::start_with(ServerOptions::default())
            .expect("redis-server must be installed (apt-get install redis-server)");
        let port = server.port();
        command(port, &request(&["SET", "a", "kept"]), b"+OK").unwrap();
        server.pause_writes(30_000).unwrap();
        let mut writer = std::net::TcpStream::connect(server.addr()).unwrap();
        writer.write_all(&request(&["SET", "b", "late"])).unwrap();
        writer
            .set_read_timeout(Some(std::time::Duration::from_millis(300)))
            .unwrap();
        let mut buf = [0u8; 64];
        let held = matches!(
            writer.read(&mut buf),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)
        );
        assert!(held, "a write was answered during the pause");
        command(port, &request(&["GET", "a"]), b"$4\r\nkept").unwrap();
        server.unpause().unwrap();
        writer
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        let n = writer.read(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"+OK\r\n");
        command(port, &request(&["GET", "b"]), b"$4\r\nlate").unwrap();
    }

    #[test]
    fn dropping_clients_closes_their_connections() {
        use std::io::{Read, Write};
        let server = RedisServer::start_with(ServerOptions::default())
            .expect("redis-server must be installed (apt-get install redis-server)");
        let mut other = std::net::TcpStream::connect(server.addr()).unwrap();
        other.write_all(&request(&["PING"])).unwrap();
        let mut buf = [0u8; 64];
        assert!(other.read(&mut buf).unwrap() > 0);
        server.drop_clients().unwrap();
        other
            .set_read_timeout(Some(std::time::Duration::from_secs(5)))
            .unwrap();
        // The server closed it: a read returns end of stream (or a reset).
        let closed = match other.read(&mut buf) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        assert!(closed, "the connection was not closed by the server");
    }
}
