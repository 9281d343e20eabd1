//! A preloadable library (`LD_PRELOAD`) that moves a process's wall clock by
//! an offset the test changes while the process runs, leaving its monotonic
//! clock alone: `redis-server` under it answers `TIME` (and scripts read
//! time) as if its host's clock had been stepped.
//!
//! libfaketime does this too, but it cannot start Debian's jemalloc build of
//! `redis-server` (jemalloc reads the clock while libfaketime resolves the
//! real functions). This library never resolves symbols or allocates: it asks
//! the kernel directly and reads the offset from a file it maps once.
//!
//! The offset file is named by `FLOTILLA_CLOCK_SHIFT_FILE` and holds one
//! little-endian `i64` of microseconds; a missing or short file means 0.
#![no_std]

use core::ffi::{c_char, c_int, c_long, c_void};
use core::sync::atomic::{AtomicPtr, AtomicU8, Ordering};

#[repr(C)]
pub struct Timespec {
    tv_sec: c_long,
    tv_nsec: c_long,
}

#[repr(C)]
pub struct Timeval {
    tv_sec: c_long,
    tv_usec: c_long,
}

unsafe extern "C" {
    fn syscall(number: c_long, ...) -> c_long;
    fn getenv(name: *const c_char) -> *mut c_char;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn mmap(addr: *mut c_void, len: usize, prot: c_int, flags: c_int, fd: c_int, off: i64)
    -> *mut c_void;
}

#[cfg(target_arch = "x86_64")]
const SYS_CLOCK_GETTIME: c_long = 228;
#[cfg(target_arch = "aarch64")]
const SYS_CLOCK_GETTIME: c_long = 113;

const CLOCK_REALTIME: c_int = 0;
const CLOCK_REALTIME_COARSE: c_int = 5;
const O_RDONLY: c_int = 0;
const PROT_READ: c_int = 1;
const MAP_SHARED: c_int = 1;
const MAP_FAILED: *mut c_void = !0usize as *mut c_void;

/// 0: not tried yet, 1: mapped (or nothing to map), 2: being mapped.
static STATE: AtomicU8 = AtomicU8::new(0);
static OFFSET: AtomicPtr<i64> = AtomicPtr::new(core::ptr::null_mut());

/// The current offset in microseconds.
fn offset_us() -> i64 {
    if STATE.load(Ordering::Acquire) == 0
        && STATE
            .compare_exchange(0, 2, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        // SAFETY: plain libc calls on a NUL-terminated name; the mapping is
        // read-only, 8 bytes, and never unmapped.
        unsafe {
            let path = getenv(c"FLOTILLA_CLOCK_SHIFT_FILE".as_ptr());
            if !path.is_null() {
                let fd = open(path, O_RDONLY);
                if fd >= 0 {
                    let p = mmap(core::ptr::null_mut(), 8, PROT_READ, MAP_SHARED, fd, 0);
                    if p != MAP_FAILED {
                        OFFSET.store(p.cast(), Ordering::Release);
                    }
                    close(fd);
                }
            }
        }
        STATE.store(1, Ordering::Release);
    }
    let p = OFFSET.load(Ordering::Acquire);
    if p.is_null() {
        0
    } else {
        // SAFETY: p maps the file's first 8 bytes; the test writes them in
        // place (never truncates), so the page stays readable.
        unsafe { core::ptr::read_volatile(p) }
    }
}

fn real_clock(clock: c_int, ts: *mut Timespec) -> c_int {
    // SAFETY: the kernel's clock_gettime with the caller's pointer.
    unsafe { syscall(SYS_CLOCK_GETTIME, clock as c_long, ts) as c_int }
}

fn shift(ts: &mut Timespec) {
    let ns = ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128 + offset_us() as i128 * 1000;
    ts.tv_sec = ns.div_euclid(1_000_000_000) as c_long;
    ts.tv_nsec = ns.rem_euclid(1_000_000_000) as c_long;
}

/// `clock_gettime(2)`, with the wall clocks shifted.
///
/// # Safety
/// As the libc function: `ts` points to writable memory.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clock_gettime(clock: c_int, ts: *mut Timespec) -> c_int {
    let rc = real_clock(clock, ts);
    if rc == 0 && (clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE) && !ts.is_null() {
        // SAFETY: the kernel just filled it.
        shift(unsafe { &mut *ts });
    }
    rc
}

/// `gettimeofday(2)`, shifted.
///
/// # Safety
/// As the libc function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gettimeofday(tv: *mut Timeval, _tz: *mut c_void) -> c_int {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let rc = real_clock(CLOCK_REALTIME, &mut ts);
    if rc != 0 {
        return rc;
    }
    shift(&mut ts);
    if !tv.is_null() {
        // SAFETY: the caller's buffer.
        unsafe {
            (*tv).tv_sec = ts.tv_sec;
            (*tv).tv_usec = ts.tv_nsec / 1000;
        }
    }
    0
}

/// `time(2)`, shifted.
///
/// # Safety
/// As the libc function.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn time(t: *mut c_long) -> c_long {
    let mut ts = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    if real_clock(CLOCK_REALTIME, &mut ts) != 0 {
        return -1;
    }
    shift(&mut ts);
    if !t.is_null() {
        // SAFETY: the caller's buffer.
        unsafe { *t = ts.tv_sec };
    }
    ts.tv_sec
}

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

/// Never called (panics abort); the precompiled `core` still names it.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}
