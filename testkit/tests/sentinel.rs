//! The Sentinel deployment fails over when its primary is killed, and the
//! old primary comes back as a replica ready for the next failover.

use std::time::{Duration, Instant};

use flotilla_testkit::{SentinelOptions, Sentinels, ServerOptions};

#[test]
fn sentinel_promotes_the_replica_when_the_primary_is_killed() {
    let mut ha = Sentinels::start().expect(
        "redis-sentinel (or redis-server) must be installed: apt-get install redis-sentinel",
    );
    let url = ha.url();
    assert!(
        url.starts_with("redis-sentinel://127.0.0.1:") && url.contains("&node="),
        "{url}"
    );
    let first = ha.primary_port().expect("a primary");
    let killed_at = Instant::now();
    assert_eq!(ha.kill_primary().unwrap(), first);
    let second = ha
        .wait_for_failover(first, Duration::from_secs(20))
        .unwrap();
    println!("failover took {:?}", killed_at.elapsed());
    assert_ne!(first, second);
    ha.restart_as_replica(first, Duration::from_secs(20))
        .unwrap();
    let killed = ha.kill_primary().unwrap();
    let third = ha
        .wait_for_failover(killed, Duration::from_secs(20))
        .unwrap();
    // Two servers, so one of the two promotions since the restart was the
    // old primary's: usually this last one (`killed` is `second`). Under
    // load the Sentinels may have failed over once more before the kill (a
    // primary slow to answer within `down_after`), promoting the old
    // primary then; it was `killed` and `second` is promoted now.
    let mut since_the_restart = [killed, third];
    since_the_restart.sort_unstable();
    let mut both = [first, second];
    both.sort_unstable();
    assert_eq!(
        since_the_restart, both,
        "the old primary, back as a replica, is promoted next (killed {killed}, promoted {third}; first {first}, second {second})"
    );
}

/// A step of the hosts' clock puts the Sentinels in TILT mode for 30 s. A
/// primary killed then is never failed over (a chaos soak's failover step
/// gave up so): `kill_primary` waits the TILT out, and the failover after
/// it takes as long as any.
#[test]
fn a_primary_is_killed_after_the_sentinels_tilt_ends() {
    let options = SentinelOptions {
        server: ServerOptions::default().clock_shift(true),
        ..SentinelOptions::default()
    };
    let mut ha = Sentinels::start_with(options).expect(
        "redis-sentinel (or redis-server) must be installed: apt-get install redis-sentinel",
    );
    let first = ha.primary_port().expect("a primary");
    ha.shift_clock(10_000).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ha.in_tilt() {
        assert!(Instant::now() < deadline, "no Sentinel entered TILT mode");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(ha.kill_primary().unwrap(), first);
    assert!(!ha.in_tilt());
    let killed_at = Instant::now();
    let second = ha
        .wait_for_failover(first, Duration::from_secs(20))
        .unwrap();
    println!("failover after the TILT took {:?}", killed_at.elapsed());
    assert_ne!(first, second);
}
