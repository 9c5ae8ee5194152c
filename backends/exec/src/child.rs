//! One running adapter process: spawn, one request line out, one reply line
//! back within a deadline (PROTO-7).
//!
//! Why threads: std has no timed read on a pipe, so a reader thread turns
//! stdout into a channel that `recv_timeout` can wait on, and a second
//! thread keeps the last few kilobytes of stderr for error messages (a
//! crashing adapter's traceback is the most useful thing to report). The
//! adapter runs in its own process group so that a hung `sh -c` pipeline
//! is killed whole, not just the shell.

use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError, sync_channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::protocol::ExecError;

/// The longest reply line accepted: far above any suite batch (tens of MB),
/// low enough that a runaway adapter cannot exhaust memory.
pub const MAX_LINE: u64 = 1 << 30;

/// How much of stderr is kept for messages.
const STDERR_TAIL: usize = 4096;

enum Line {
    Text(String),
    TooLong,
    ReadError(String),
}

/// A started adapter.
pub struct Process {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<Line>,
    stderr: Arc<Mutex<VecDeque<u8>>>,
    stderr_thread: Option<JoinHandle<()>>,
}

impl Process {
    /// Runs `command` with `sh -c` in a process group of its own.
    pub fn spawn(command: &str) -> Result<Process, ExecError> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(command)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .map_err(|e| ExecError::Spawn { command: command.to_string(), message: e.to_string() })?;
        let (stdin, stdout, stderr) = match (child.stdin.take(), child.stdout.take(), child.stderr.take()) {
            (Some(i), Some(o), Some(e)) => (i, o, e),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ExecError::Spawn { command: command.to_string(), message: "its pipes were not created".into() });
            }
        };
        // Capacity 1: the reader never runs more than one reply ahead.
        let (tx, lines) = sync_channel(1);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            loop {
                let mut buf = Vec::new();
                let line = match (&mut reader).take(MAX_LINE).read_until(b'\n', &mut buf) {
                    Ok(0) => break, // EOF: the adapter exited or closed stdout
                    Ok(_) if !buf.ends_with(b"\n") && buf.len() as u64 >= MAX_LINE => Line::TooLong,
                    Ok(_) => Line::Text(String::from_utf8_lossy(&buf).into_owned()),
                    Err(e) => Line::ReadError(e.to_string()),
                };
                let stop = !matches!(line, Line::Text(_));
                if tx.send(line).is_err() || stop {
                    break;
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::with_capacity(STDERR_TAIL)));
        let sink = Arc::clone(&tail);
        let stderr_thread = std::thread::spawn(move || {
            let mut stderr = stderr;
            let mut chunk = [0u8; 1024];
            while let Ok(n) = stderr.read(&mut chunk) {
                if n == 0 {
                    break;
                }
                let mut t = sink.lock().unwrap_or_else(|e| e.into_inner());
                t.extend(&chunk[..n]);
                let excess = t.len().saturating_sub(STDERR_TAIL);
                t.drain(..excess);
            }
        });
        Ok(Process { child, stdin: Some(stdin), lines, stderr: tail, stderr_thread: Some(stderr_thread) })
    }

    /// The last few KB the adapter wrote to stderr.
    pub fn stderr_tail(&self) -> String {
        let t = self.stderr.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = t.as_slices();
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }

    /// Sends one line and waits up to `timeout` for one line back. Any
    /// failure leaves the process unusable: the caller drops it (which
    /// kills it) and starts a fresh one for the next call.
    pub fn exchange(&mut self, op: &str, request: &str, timeout: Duration) -> Result<String, ExecError> {
        let deadline = Instant::now() + timeout;
        let written = match self.stdin.as_mut() {
            Some(stdin) => stdin.write_all(request.as_bytes()).and_then(|()| stdin.write_all(b"\n")).and_then(|()| stdin.flush()),
            None => Err(std::io::Error::other("stdin already closed")),
        };
        if written.is_err() {
            // A broken pipe means the adapter is gone: report how it ended.
            return Err(self.ended(op));
        }
        match self.lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(Line::Text(line)) => Ok(line),
            Ok(Line::TooLong) => Err(ExecError::Malformed { op: op.into(), field: "(line)".into(), reason: format!("a reply line longer than {MAX_LINE} bytes") }),
            Ok(Line::ReadError(message)) => Err(ExecError::Io { op: op.into(), message, stderr: self.stderr_tail() }),
            Err(RecvTimeoutError::Timeout) => {
                self.kill();
                Err(ExecError::Timeout { op: op.into(), seconds: timeout.as_secs_f64(), stderr: self.settled_stderr() })
            }
            Err(RecvTimeoutError::Disconnected) => Err(self.ended(op)),
        }
    }

    /// The error for an adapter whose stdout closed: its exit status if it
    /// exits within a second (else it is killed), and its stderr tail.
    fn ended(&mut self, op: &str) -> ExecError {
        let start = Instant::now();
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break s.to_string(),
                Ok(None) if start.elapsed() < Duration::from_secs(1) => std::thread::sleep(Duration::from_millis(10)),
                _ => {
                    self.kill();
                    break "closed stdout without exiting; killed".to_string();
                }
            }
        };
        ExecError::Crashed { op: op.into(), status, stderr: self.settled_stderr() }
    }

    /// The stderr tail once the stderr thread has drained the pipe (bounded
    /// wait: a grandchild that escaped the group may hold it open).
    fn settled_stderr(&mut self) -> String {
        let start = Instant::now();
        while self.stderr_thread.as_ref().is_some_and(|t| !t.is_finished()) && start.elapsed() < Duration::from_millis(500) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stderr_tail()
    }

    /// Kills the adapter's whole process group and reaps it.
    fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: kill(2) with a negative pid signals the process group
            // this process created with `process_group(0)`; no memory is touched.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    /// Closes stdin (a well-behaved adapter exits on EOF), gives it a moment,
    /// then kills whatever is left.
    fn drop(&mut self) {
        drop(self.stdin.take());
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(200) {
            if let Ok(Some(_)) = self.child.try_wait() {
                // Exited and reaped: its group id may be reused now, so it is not signalled.
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        self.kill();
    }
}
