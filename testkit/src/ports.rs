//! Ports for test servers, held for a server's whole life.
//!
//! A server restarted on its port (a crash, a rollback, an empty restart)
//! leaves that port free while it is down. A port picked with `bind(0)` by
//! another test, in this process or another, could then be the same one:
//! the other test's server binds it, ours fails to, and its readiness
//! check would find a server answering there, the wrong one. So a test
//! server's port comes from below the kernel's ephemeral range (which
//! `bind(0)` and outgoing connections never use) and is reserved by an
//! advisory lock on a file named after it, which every testkit in every
//! process honours and which the kernel releases if the process dies.

use std::fs::File;
use std::hash::{BuildHasher, RandomState};
use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;

use crate::Error;

/// The lowest port handed out: above the well-known and most registered
/// service ports.
const LOWEST: u16 = 20_000;

/// A port reserved for one server; released when dropped.
#[derive(Debug)]
pub(crate) struct PortLease {
    port: u16,
    // Held, not read: the advisory lock lives as long as the open file.
    _lock: File,
}

impl PortLease {
    /// The reserved port.
    pub(crate) fn port(&self) -> u16 {
        self.port
    }
}

/// Reserves a port on `127.0.0.1` that nothing listens on and that no other
/// testkit server holds.
///
/// # Errors
/// [`Error::Startup`] when the lock directory cannot be made or no port in
/// the range is free.
pub(crate) fn lease_port() -> Result<PortLease, Error> {
    let (low, high) = reserved_range();
    let dir = lock_dir()?;
    let span = u64::from(high - low);
    let start = RandomState::new().hash_one(std::process::id()) % span;
    for step in 0..span {
        let port = low + ((start + step) % span) as u16;
        let path = dir.join(format!("{port}.lock"));
        let Ok(file) = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        if file.try_lock().is_err() {
            continue; // another server holds it
        }
        // Held by something that is not a testkit server.
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_err() {
            continue;
        }
        return Ok(PortLease { port, _lock: file });
    }
    Err(Error::Startup(format!(
        "no free port between {low} and {high} for a test server"
    )))
}

/// `[LOWEST, first ephemeral port)`, or a fixed range when the kernel's
/// range cannot be read or leaves too little below it.
fn reserved_range() -> (u16, u16) {
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok());
    match ephemeral_low {
        Some(low) if low >= LOWEST + 2_000 => (LOWEST, low),
        _ => (LOWEST, LOWEST + 8_000),
    }
}

fn lock_dir() -> Result<PathBuf, Error> {
    let dir = std::env::temp_dir().join("flotilla-testkit-ports");
    std::fs::create_dir_all(&dir)
        .map_err(|e| Error::Startup(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_port_is_not_leased_again_until_dropped() {
        let first = lease_port().unwrap();
        let first_port = first.port();
        let others: Vec<PortLease> = (0..50).map(|_| lease_port().unwrap()).collect();
        assert!(others.iter().all(|l| l.port() != first.port()));
        let (low, high) = reserved_range();
        assert!((low..high).contains(&first.port()));
        // The lock is per open file: another open of the same file, as
        // another process would make, is refused while it is held.
        let path = lock_dir().unwrap().join(format!("{}.lock", first.port()));
        let again = File::options().write(true).open(&path).unwrap();
        assert!(
            again.try_lock().is_err(),
            "a held port's lock is taken twice"
        );
        drop(first);

        // Dropping a lease releases its lock. Not checked on the shared
        // directory: a test running beside this one may lease the freed
        // port at once (CI saw "a dropped lease keeps its lock"). And a
        // process forking a server meanwhile holds a copy of every open
        // file until its exec: the lock may outlive the drop by that long.
        let private = std::env::temp_dir().join(format!(
            "flotilla-testkit-lease-drop-{}.lock",
            std::process::id()
        ));
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&private)
            .unwrap();
        file.try_lock().unwrap();
        let lease = PortLease {
            port: first_port,
            _lock: file,
        };
        let again = File::options().write(true).open(&private).unwrap();
        assert!(again.try_lock().is_err(), "a lease's lock is taken twice");
        drop(lease);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let released = loop {
            if again.try_lock().is_ok() {
                break true;
            }
            if std::time::Instant::now() > deadline {
                break false;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        let _ = std::fs::remove_file(&private);
        assert!(released, "a dropped lease keeps its lock");
    }
}
