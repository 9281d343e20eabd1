//! A test server's wall clock moved while it runs: its host's clock
//! stepped (an NTP correction, a virtual machine resumed), as Redis sees it.
//!
//! [`ServerOptions::clock_shift`](crate::ServerOptions::clock_shift) starts
//! `redis-server` with a small preloaded library (built from
//! `testkit/clock_shift/shim.rs` by this crate's build script) that adds an
//! offset to the wall clock (`gettimeofday`, `clock_gettime` of the
//! realtime clocks, `time`) and leaves the monotonic clock alone. `TIME`,
//! `TIME` inside scripts and key expiry all follow the offset, which
//! [`RedisServer::shift_clock`](crate::RedisServer::shift_clock) changes at
//! any moment. The offset lives in a file in the server's data directory
//! (one little-endian `i64` of microseconds), written in place, which the
//! library maps once.

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::Error;

/// Name of the offset file in the server's data directory.
const OFFSET_FILE: &str = "clock-shift";

/// The preloadable library, or why there is none.
pub(crate) fn library() -> Result<PathBuf, Error> {
    let path = env!("FLOTILLA_CLOCK_SHIFT_LIB");
    if path.is_empty() {
        return Err(Error::Startup(
            "the clock-shift library was not built: it needs Linux on x86_64 or aarch64 \
             (see the warning of flotilla-testkit's build script)"
                .into(),
        ));
    }
    let path = PathBuf::from(path);
    if !path.exists() {
        return Err(Error::Startup(format!(
            "the clock-shift library {} is missing: rebuild flotilla-testkit",
            path.display()
        )));
    }
    Ok(path)
}

/// The offset file in `dir`, created with a zero offset if missing.
pub(crate) fn offset_file(dir: &Path) -> Result<PathBuf, Error> {
    let path = dir.join(OFFSET_FILE);
    if !path.exists() {
        write_offset(&path, 0)?;
    }
    Ok(path)
}

/// Writes the offset (µs) in place: the server maps the file, so it must
/// never be truncated.
pub(crate) fn write_offset(path: &Path, offset_us: i64) -> Result<(), Error> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(|e| Error::Startup(format!("cannot open {}: {e}", path.display())))?;
    file.write_all_at(&offset_us.to_le_bytes(), 0)
        .map_err(|e| Error::Startup(format!("cannot write {}: {e}", path.display())))
}

/// The offset (µs) in the file at `path`.
pub(crate) fn read_offset(path: &Path) -> Result<i64, Error> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Startup(format!("cannot read {}: {e}", path.display())))?;
    let first: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .unwrap_or_default();
    Ok(i64::from_le_bytes(first))
}
