//! Smoke test: the benchmark binary builds and describes its options
//! (the measuring runs are a program, not part of the test suite).

use std::process::Command;

#[test]
fn help_lists_the_options_and_hides_the_worker_subcommand() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .arg("--help")
        .output()
        .expect("the bench binary runs");
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for option in ["--jobs", "--skip-scale", "--only", "--json", "--peer"] {
        assert!(help.contains(option), "--help lacks {option}:\n{help}");
    }
    // `worker` and `join-probe` are internal: no Commands section.
    assert!(
        !help.contains("Commands:"),
        "internal subcommands shown:\n{help}"
    );
    assert!(
        !help.contains("join-probe"),
        "internal subcommands shown:\n{help}"
    );
}

#[test]
fn unknown_section_is_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench"))
        .args(["--only", "nonsense"])
        .output()
        .expect("the bench binary runs");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonsense"));
}
