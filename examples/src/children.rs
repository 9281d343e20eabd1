//! Child processes of an example: the running binary re-executed with other
//! arguments, each killed when its handle is dropped (on every error path
//! too), so that an example never leaves a process behind.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::mpsc;

use crate::BoxError;

/// What a child's standard output becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Dropped.
    Quiet,
    /// Printed by the parent, each line prefixed with the child's label.
    Prefixed,
    /// Sent line by line to the channel given by [`Children::lines`].
    Captured,
}

/// A set of child processes, killed (SIGKILL) when dropped.
#[derive(Debug)]
pub struct Children {
    running: Vec<Running>,
    lines_tx: mpsc::UnboundedSender<(String, String)>,
    lines_rx: Option<mpsc::UnboundedReceiver<(String, String)>>,
}

#[derive(Debug)]
struct Running {
    label: String,
    pid: u32,
    child: Child,
}

impl Default for Children {
    fn default() -> Self {
        let (lines_tx, lines_rx) = mpsc::unbounded_channel();
        Children {
            running: Vec::new(),
            lines_tx,
            lines_rx: Some(lines_rx),
        }
    }
}

impl Children {
    /// Starts this binary again with `args`; its output is printed with a
    /// `[label]` prefix. Returns the child's process id.
    ///
    /// # Errors
    /// When the binary cannot be found or started.
    pub fn spawn_self(&mut self, label: &str, args: &[&str]) -> Result<u32, BoxError> {
        self.spawn_self_with(label, args, Output::Prefixed)
    }

    /// Starts this binary again with `args`, its standard output handled as
    /// `output` (standard error is inherited). Returns the process id.
    ///
    /// # Errors
    /// When the binary cannot be found or started.
    pub fn spawn_self_with(
        &mut self,
        label: &str,
        args: &[&str],
        output: Output,
    ) -> Result<u32, BoxError> {
        let exe = std::env::current_exe()?;
        let mut command = Command::new(exe);
        command
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        command.stdout(match output {
            Output::Quiet => Stdio::null(),
            Output::Prefixed | Output::Captured => Stdio::piped(),
        });
        let mut child = command.spawn()?;
        let pid = child.id().ok_or("child exited at once")?;
        if let Some(stdout) = child.stdout.take() {
            let label = label.to_string();
            let tx = self.lines_tx.clone();
            tokio::spawn(async move {
                let mut lines = BufReader::new(stdout).lines();
                while let Ok(Some(line)) = lines.next_line().await {
                    if output == Output::Captured {
                        let _ = tx.send((label.clone(), line));
                    } else {
                        println!("[{label}] {line}");
                    }
                }
            });
        }
        self.running.push(Running {
            label: label.to_string(),
            pid,
            child,
        });
        Ok(pid)
    }

    /// The lines of children started with [`Output::Captured`], as
    /// `(label, line)`. Can be taken once.
    pub fn lines(&mut self) -> Option<mpsc::UnboundedReceiver<(String, String)>> {
        self.lines_rx.take()
    }

    /// Process id of the child called `label`.
    pub fn pid(&self, label: &str) -> Option<u32> {
        self.running
            .iter()
            .find(|r| r.label == label)
            .map(|r| r.pid)
    }

    /// Number of children not yet reaped.
    pub fn len(&self) -> usize {
        self.running.len()
    }

    /// Whether every child was reaped.
    pub fn is_empty(&self) -> bool {
        self.running.is_empty()
    }

    /// Kills the child called `label` with SIGKILL (no goodbye, as in a
    /// crash) and reaps it.
    ///
    /// # Errors
    /// When no child has that label or the kill failed.
    pub async fn kill(&mut self, label: &str) -> Result<(), BoxError> {
        let index = self
            .running
            .iter()
            .position(|r| r.label == label)
            .ok_or_else(|| format!("no child called {label}"))?;
        let mut running = self.running.remove(index);
        running.child.kill().await?;
        Ok(())
    }

    /// Waits up to `grace` for every child to exit by itself, then kills
    /// the rest. Returns the labels of the children that had to be killed.
    pub async fn wait_all(&mut self, grace: Duration) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + grace;
        let mut killed = Vec::new();
        for mut running in self.running.drain(..) {
            let waited = tokio::time::timeout_at(deadline, running.child.wait()).await;
            if !matches!(waited, Ok(Ok(_))) {
                let _ = running.child.kill().await;
                killed.push(running.label);
            }
        }
        killed
    }

    /// Kills every child at once and reaps them.
    pub async fn kill_all(&mut self) {
        for mut running in self.running.drain(..) {
            let _ = running.child.kill().await;
        }
    }
}
