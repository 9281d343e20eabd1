//! Rolling a server back to an older state, as a replica promotion with
//! lost writes or a crash under `appendfsync everysec` does: Redis comes
//! back neither empty nor current, but as it was some seconds ago.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{Error, RedisServer};

/// A saved copy of a server's data ([`RedisServer::save_snapshot`]).
#[derive(Debug, Clone)]
pub struct RedisSnapshot {
    path: PathBuf,
}

impl RedisSnapshot {
    /// Where the copy is (an RDB file in the server's data directory).
    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl RedisServer {
    /// Saves the current data (`SAVE`) and keeps a copy of it, to roll back
    /// to later with [`RedisServer::roll_back`].
    ///
    /// # Errors
    /// [`Error::Startup`] when `SAVE` fails or the copy cannot be made.
    pub fn save_snapshot(&self) -> Result<RedisSnapshot, Error> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        command(self.port(), b"*1\r\n$4\r\nSAVE\r\n", b"+OK")?;
        let path = self.data_dir().join(format!(
            "snapshot-{}.rdb",
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::copy(self.data_dir().join("dump.rdb"), &path)
            .map_err(|e| Error::Startup(format!("copying the snapshot: {e}")))?;
        Ok(RedisSnapshot { path })
    }

    /// Kills the server (`SIGKILL`) and starts it again from `snapshot`:
    /// every write made after the snapshot is lost, everything before it is
    /// back (the AOF, if any, is rebuilt from the snapshot).
    ///
    /// # Errors
    /// [`Error::Startup`] when the files cannot be replaced or the server
    /// does not start again.
    pub fn roll_back(&mut self, snapshot: &RedisSnapshot) -> Result<(), Error> {
        self.kill();
        let dir = self.data_dir().to_path_buf();
        let restore = |e: std::io::Error| Error::Startup(format!("restoring the snapshot: {e}"));
        let aof = dir.join("appendonlydir");
        if aof.exists() {
            // With AOF on, Redis loads only the AOF: make the snapshot its
            // base (a Redis 7 AOF may start with an RDB file).
            std::fs::remove_dir_all(&aof).map_err(restore)?;
            std::fs::create_dir(&aof).map_err(restore)?;
            std::fs::copy(&snapshot.path, aof.join("appendonly.aof.1.base.rdb"))
                .map_err(restore)?;
            std::fs::write(
                aof.join("appendonly.aof.manifest"),
                "file appendonly.aof.1.base.rdb seq 1 type b\n",
            )
            .map_err(restore)?;
        }
        std::fs::copy(&snapshot.path, dir.join("dump.rdb")).map_err(restore)?;
        self.start_again()
    }
}

impl RedisServer {
    /// Deletes every key (`FLUSHALL SYNC`) while the server keeps running:
    /// its data is lost as by an empty restart, but its run id stays the
    /// same (an operator's mistake, a script gone wrong).
    ///
    /// # Errors
    /// [`Error::Startup`] when the command fails.
    pub fn flush_all(&self) -> Result<(), Error> {
        command(
            self.port(),
            b"*2\r\n$8\r\nFLUSHALL\r\n$4\r\nSYNC\r\n",
            b"+OK",
        )
    }
}

/// Sends one RESP command and checks the reply starts with `expect`.
pub(crate) fn command(port: u16, request: &[u8], expect: &[u8]) -> Result<(), Error> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let fail = |what: String| Error::Startup(format!("redis on port {port}: {what}"));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))
        .map_err(|e| fail(format!("connect: {e}")))?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .map_err(|e| fail(e.to_string()))?;
    stream
        .write_all(request)
        .map_err(|e| fail(format!("write: {e}")))?;
    let mut buf = [0u8; 256];
    let n = stream
        .read(&mut buf)
        .map_err(|e| fail(format!("read: {e}")))?;
    if buf[..n].starts_with(expect) {
        Ok(())
    } else {
        Err(fail(format!(
            "unexpected reply {:?}",
            String::from_utf8_lossy(&buf[..n])
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ServerOptions;

    /// A server restarted from a snapshot answers `INFO` while it loads
    /// it, and refuses other commands (`-LOADING`) until it is done: it is
    /// ready only then (a chaos run's `SAVE` right after a rollback failed
    /// with `LOADING` when readiness was only its pid in `INFO`).
    #[test]
    fn a_server_rolled_back_to_a_large_snapshot_is_ready_once_loaded() {
        let mut server = RedisServer::start()
            .expect("redis-server must be installed (apt-get install redis-server)");
        let port = server.port();
        // Enough keys for loading them to take a while.
        let fill = b"*3\r\n$4\r\nEVAL\r\n$90\r\nfor i = 1, 1500000 do redis.call('SET', 'k' .. i, 'v') end return redis.status_reply('OK')\r\n$1\r\n0\r\n";
        command(port, fill, b"+OK").unwrap();
        let snapshot = server.save_snapshot().unwrap();
        server.roll_back(&snapshot).unwrap();
        command(port, b"*1\r\n$4\r\nSAVE\r\n", b"+OK").unwrap();
        command(port, b"*1\r\n$6\r\nDBSIZE\r\n", b":1500000").unwrap();
    }

    #[test]
    fn a_rollback_brings_back_the_snapshot_and_loses_later_writes() {
        for aof in [false, true] {
            let mut server = RedisServer::start_with(ServerOptions::default().aof(aof))
                .expect("redis-server must be installed (apt-get install redis-server)");
            let port = server.port();
            command(port, b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$3\r\nold\r\n", b"+OK").unwrap();
            let snapshot = server.save_snapshot().unwrap();
            command(port, b"*3\r\n$3\r\nSET\r\n$1\r\na\r\n$3\r\nnew\r\n", b"+OK").unwrap();
            command(port, b"*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\nx\r\n", b"+OK").unwrap();
            server.roll_back(&snapshot).unwrap();
            command(port, b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n", b"$3\r\nold").unwrap();
            command(port, b"*2\r\n$6\r\nEXISTS\r\n$1\r\nb\r\n", b":0").unwrap();
            // Writes after the rollback persist as usual.
            command(port, b"*3\r\n$3\r\nSET\r\n$1\r\nc\r\n$1\r\ny\r\n", b"+OK").unwrap();
            if aof {
                server.restart().unwrap();
                command(port, b"*2\r\n$6\r\nEXISTS\r\n$1\r\nc\r\n", b":1").unwrap();
                command(port, b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n", b"$3\r\nold").unwrap();
            }
        }
    }
}
