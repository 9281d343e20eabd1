//! `watch`: a live view of `status` drawn with ratatui, refreshed every
//! interval; q, Esc or Ctrl-C quits. `--frames N` renders N frames as
//! plain text instead (no terminal needed: scripts and tests use it).

use std::io::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use flotilla_pool::inspect;
use fred::prelude::Client;
use ratatui::backend::{CrosstermBackend, TestBackend};
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use ratatui::crossterm::{ExecutableCommand, cursor};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Block, Borders, Paragraph, Row, Table};
use ratatui::{Frame, Terminal};
use tokio::sync::mpsc;

use crate::commands::need_pool;
use crate::error::{CtlError, CtlResult};
use crate::format::{ago, duration_ms, fit};
use crate::views::{StatusView, status_view};

/// Widest job bar, in cells.
const BAR_WIDTH: usize = 20;

/// Options of `watch`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WatchOptions {
    pub(crate) frames: Option<u32>,
    pub(crate) interval: Duration,
    pub(crate) width: u16,
    pub(crate) height: u16,
    pub(crate) worker_ttl: Duration,
}

/// Runs `watch` for `pool`.
pub(crate) async fn run(cli: &crate::cli::Cli, client: &Client, opts: WatchOptions) -> CtlResult {
    let pool = need_pool(cli)?;
    if opts.interval.is_zero() {
        return Err(CtlError::Usage(
            "--interval must be greater than zero".into(),
        ));
    }
    match opts.frames {
        Some(n) => frames(client, pool, n, opts).await,
        None => {
            need_terminal()?;
            interactive(client, pool, opts).await
        }
    }
}

/// Refuses the live view when stdout is not a terminal.
pub(crate) fn need_terminal() -> CtlResult {
    if std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        Ok(())
    } else {
        Err(CtlError::Usage(
            "watch needs a terminal; use --frames N for plain-text output".into(),
        ))
    }
}

async fn snapshot(client: &Client, pool: &str, ttl: Duration) -> CtlResult<StatusView> {
    // No stderr notes here: they would land on the drawn screen.
    let (snap, locks) = tokio::try_join!(
        inspect::PoolSnapshot::read(client, pool),
        inspect::locks(client, Some(pool))
    )?;
    Ok(status_view(&snap, &locks, ttl))
}

/// Renders `n` frames as plain text, one after another.
async fn frames(client: &Client, pool: &str, n: u32, opts: WatchOptions) -> CtlResult {
    let width = opts.width.max(20);
    let height = opts.height.max(5);
    let mut terminal = Terminal::new(TestBackend::new(width, height))?;
    let mut stdout = std::io::stdout().lock();
    for i in 0..n {
        let view = snapshot(client, pool, opts.worker_ttl).await?;
        terminal.draw(|f| draw(f, &view))?;
        let buffer = terminal.backend().buffer();
        writeln!(stdout, "frame {}/{n}", i + 1)?;
        for row in buffer.content().chunks(usize::from(width)) {
            let line: String = row.iter().map(|c| c.symbol()).collect();
            writeln!(stdout, "{}", line.trim_end())?;
        }
        stdout.flush()?;
        if i + 1 < n {
            tokio::time::sleep(opts.interval).await;
        }
    }
    Ok(())
}

/// Restores the terminal however the view ends.
struct TerminalGuard;

impl Drop for TerminalGuard {
    fn drop(&mut self) {
        let _ = disable_raw_mode();
        let mut out = std::io::stdout();
        let _ = out.execute(LeaveAlternateScreen);
        let _ = out.execute(cursor::Show);
    }
}

async fn interactive(client: &Client, pool: &str, opts: WatchOptions) -> CtlResult {
    enable_raw_mode()?;
    let _guard = TerminalGuard;
    std::io::stdout().execute(EnterAlternateScreen)?;
    let mut terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))?;
    terminal.hide_cursor()?;
    // Keys are read on a thread of their own (crossterm's reads block);
    // it stops when asked or when the channel closes.
    let (tx, mut keys) = mpsc::channel::<()>(1);
    let stop = Arc::new(AtomicBool::new(false));
    let reader_stop = stop.clone();
    let reader = std::thread::spawn(move || {
        while !reader_stop.load(Ordering::Relaxed) {
            if !event::poll(Duration::from_millis(100)).unwrap_or(false) {
                continue;
            }
            if let Ok(Event::Key(k)) = event::read() {
                let ctrl_c =
                    k.code == KeyCode::Char('c') && k.modifiers.contains(KeyModifiers::CONTROL);
                let quit = matches!(k.code, KeyCode::Char('q') | KeyCode::Esc) || ctrl_c;
                if k.kind == KeyEventKind::Press && quit {
                    let _ = tx.blocking_send(());
                    return;
                }
            }
        }
    });
    let result = loop {
        match snapshot(client, pool, opts.worker_ttl).await {
            Ok(view) => {
                if let Err(e) = terminal.draw(|f| draw(f, &view)) {
                    break Err(e.into());
                }
            }
            Err(e) => break Err(e),
        }
        tokio::select! {
            _ = keys.recv() => break Ok(()),
            _ = tokio::time::sleep(opts.interval) => {}
        }
    };
    stop.store(true, Ordering::Relaxed);
    let _ = reader.join();
    let _ = terminal.backend_mut().flush();
    result
}

/// Draws one frame of the status view.
fn draw(f: &mut Frame, v: &StatusView) {
    let c = &v.counts;
    let secs = (v.server_time_ms / 1000) % 86_400;
    let clock = format!(
        "{:02}:{:02}:{:02} UTC",
        secs / 3600,
        (secs / 60) % 60,
        secs % 60
    );
    let mut summary = vec![
        Line::from(c.membership_line()),
        Line::from(format!(
            "pending {}  cleanups {}  queued {}  locks {}",
            c.pending, c.cleanups, c.queued_events, c.locks
        )),
    ];
    if let Some(by) = &v.shutdown_requested_by {
        summary.push(Line::styled(
            format!("SHUTTING DOWN (requested by {by})"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ));
    }
    let lock_lines = v.locks.len().min(3) as u16;
    let [top, middle, bottom, help] = Layout::vertical([
        Constraint::Length(summary.len() as u16 + 2),
        Constraint::Min(3),
        Constraint::Length(lock_lines + 2),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let title = format!(" pool {} · {clock} ", v.pool);
    f.render_widget(
        Paragraph::new(summary).block(Block::default().borders(Borders::ALL).title(title)),
        top,
    );
    let max_jobs = v.workers.iter().map(|w| w.jobs).max().unwrap_or(0).max(1);
    let rows = v.workers.iter().map(|w| {
        let len = (w.jobs * BAR_WIDTH).div_ceil(max_jobs);
        let style = match w.state {
            "active" => Style::default().fg(Color::Green),
            "stale" => Style::default().fg(Color::Yellow),
            "drained" => Style::default().fg(Color::Gray),
            _ => Style::default().fg(Color::Red),
        };
        Row::new(vec![
            fit(&w.id, 14),
            w.state.to_string(),
            ago(w.keepalive_age_ms),
            format!("{:>4} {}", w.jobs, "█".repeat(len)),
        ])
        .style(style)
    });
    let table = Table::new(
        rows,
        [
            Constraint::Length(14),
            Constraint::Length(8),
            Constraint::Length(10),
            Constraint::Min(10),
        ],
    )
    .header(
        Row::new(vec!["WORKER", "STATE", "KEEPALIVE", "JOBS"])
            .style(Style::default().add_modifier(Modifier::BOLD)),
    )
    .block(Block::default().borders(Borders::ALL).title(" workers "));
    f.render_widget(table, middle);
    let locks: Vec<Line> = v
        .locks
        .iter()
        .take(3)
        .map(|l| {
            Line::from(format!(
                "{} held by {} (token {}, heartbeat {})",
                l.name,
                l.owner,
                l.token,
                ago(Some(l.heartbeat_age_ms))
            ))
        })
        .collect();
    f.render_widget(
        Paragraph::new(locks).block(Block::default().borders(Borders::ALL).title(" locks ")),
        bottom,
    );
    f.render_widget(
        Paragraph::new(format!(
            "q / Ctrl-C quits · worker TTL {}",
            duration_ms(v.worker_ttl_ms)
        )),
        help,
    );
}
