//! Applications that generate and sink traffic on simulated hosts.

use core::time::Duration;
use std::collections::VecDeque;
use std::net::SocketAddrV4;
use userstack::stack::{Event, SocketHandle, Stack};
use userstack::time::Instant;

/// Bytes handed to `send` (content is irrelevant to the simulator).
static PAYLOAD: [u8; 65536] = [0x5a; 65536];

/// Counters the applications keep for the metrics.
#[derive(Debug, Default)]
pub struct AppContext {
    /// Per-flow delivered bytes and sender handle.
    pub flows: Vec<FlowProgress>,
    /// Short connections opened.
    pub short_started: u64,
    /// Completion times of short connections, in milliseconds.
    pub short_fct_ms: Vec<f64>,
    /// Where receivers read into (allocated on first use, then reused).
    scratch: Vec<u8>,
}

/// Bytes a receiver reads per `recv` call.
const READ_CHUNK: usize = 16384;

/// One long-lived flow's progress.
#[derive(Debug, Default, Clone, Copy)]
pub struct FlowProgress {
    /// Bytes read by the receiving application.
    pub delivered: u64,
    /// Host index and handle of the sending connection.
    pub sender: Option<(usize, SocketHandle)>,
}

/// How a long-lived sender writes.
#[derive(Debug, Clone, Copy)]
pub enum Pattern {
    /// Keep the send buffer full, up to `limit` bytes if given.
    Bulk {
        /// Total bytes, or unlimited.
        limit: Option<u64>,
    },
    /// Write `write_bytes` every `interval`.
    Cbr {
        /// Bytes per write.
        write_bytes: usize,
        /// Time between writes.
        interval: Duration,
    },
    /// Bulk for `on`, silent for `off`, repeatedly.
    OnOff {
        /// Burst length.
        on: Duration,
        /// Silence length.
        off: Duration,
    },
}

/// An application on a host.
#[derive(Debug)]
pub enum App {
    /// Opens one connection and writes per its pattern.
    Sender {
        /// Flow index.
        flow: usize,
        /// Host index (to find the connection for traces).
        host: usize,
        /// Destination.
        remote: SocketAddrV4,
        /// Write pattern.
        pattern: Pattern,
        /// When to connect.
        start: Instant,
        /// The connection once opened.
        handle: Option<SocketHandle>,
        /// Bytes accepted by the stack so far.
        written: u64,
        /// Next CBR write.
        next_write: Instant,
    },
    /// Accepts on `port` and reads everything for `flow`.
    Receiver {
        /// Flow index.
        flow: usize,
        /// Listening port.
        port: u16,
        /// Accepted connections.
        handles: Vec<SocketHandle>,
    },
    /// Opens a connection every `interval` until `until`, sends `bytes`, and closes it `hold`
    /// after all is acknowledged.
    ShortSender {
        /// Destination.
        remote: SocketAddrV4,
        /// Time between opens.
        interval: Duration,
        /// Bytes per connection.
        bytes: u64,
        /// Time a connection stays open after its bytes are acknowledged.
        hold: Duration,
        /// No open after this (`None`: until the end).
        until: Option<Instant>,
        /// Next open.
        next_open: Instant,
        /// Connections still sending or waiting for their ACKs.
        active: Vec<ShortConnection>,
        /// Acknowledged connections and when each closes, oldest first (the hold is the same
        /// for all, so this is also closing order): only the due ones are touched.
        held: VecDeque<(Instant, SocketHandle)>,
    },
    /// Accepts short connections, reads them and closes them at end of stream; it acts on
    /// the stack's readiness events, so thousands of idle connections cost nothing.
    ShortReceiver {
        /// Listening port.
        port: u16,
    },
}

/// One connection of a [`App::ShortSender`].
#[derive(Debug, Clone, Copy)]
pub struct ShortConnection {
    /// The socket.
    pub handle: SocketHandle,
    /// When it was opened.
    pub started: Instant,
    /// Bytes the stack has accepted.
    pub written: u64,
}

fn write_up_to(stack: &mut Stack, handle: SocketHandle, mut remaining: u64) -> u64 {
    let mut total = 0;
    while remaining > 0 {
        let chunk = remaining.min(PAYLOAD.len() as u64) as usize;
        let n = stack.send(handle, &PAYLOAD[..chunk]).unwrap_or(0);
        total += n as u64;
        remaining -= n as u64;
        if n < chunk {
            break;
        }
    }
    total
}

fn drain(stack: &mut Stack, handle: SocketHandle, buf: &mut Vec<u8>) -> u64 {
    if buf.len() < READ_CHUNK {
        buf.resize(READ_CHUNK, 0);
    }
    let mut total = 0;
    while let Ok(n) = stack.recv(handle, buf) {
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    total
}

/// Reads what a short connection has and closes it at end of stream or on error.
fn serve_short(stack: &mut Stack, handle: SocketHandle, buf: &mut Vec<u8>) {
    drain(stack, handle, buf);
    if stack
        .connection(handle)
        .is_some_and(|c| c.is_recv_finished() || c.error().is_some())
    {
        let _ = stack.close(handle);
    }
}

impl App {
    /// Does whatever is due at `now`; returns when it next needs to run on its own (events on
    /// the host also run it).
    pub fn run(
        &mut self,
        now: Instant,
        stack: &mut Stack,
        events: &[Event],
        ctx: &mut AppContext,
    ) -> Option<Instant> {
        match self {
            App::Sender {
                flow,
                host,
                remote,
                pattern,
                start,
                handle,
                written,
                next_write,
            } => {
                if now < *start {
                    return Some(*start);
                }
                let h = match *handle {
                    Some(h) => h,
                    None => {
                        let h = stack.connect(*remote).ok()?;
                        *handle = Some(h);
                        ctx.flows[*flow].sender = Some((*host, h));
                        *next_write = now;
                        h
                    }
                };
                match *pattern {
                    Pattern::Bulk { limit } => {
                        let remaining = limit.map_or(u64::MAX, |l| l - *written);
                        *written += write_up_to(stack, h, remaining);
                        if limit == Some(*written) {
                            let _ = stack.shutdown(h);
                        }
                        None
                    }
                    Pattern::Cbr {
                        write_bytes,
                        interval,
                    } => {
                        while *next_write <= now {
                            *written += write_up_to(stack, h, write_bytes as u64);
                            *next_write += interval;
                        }
                        Some(*next_write)
                    }
                    Pattern::OnOff { on, off } => {
                        let period = (on + off).as_nanos() as u64;
                        let phase = (now - *start).as_nanos() as u64 % period.max(1);
                        if phase < on.as_nanos() as u64 {
                            *written += write_up_to(stack, h, u64::MAX);
                            Some(now + Duration::from_nanos(on.as_nanos() as u64 - phase))
                        } else {
                            Some(now + Duration::from_nanos(period - phase))
                        }
                    }
                }
            }
            App::Receiver {
                flow,
                port,
                handles,
            } => {
                while let Some(h) = stack.accept(*port) {
                    handles.push(h);
                }
                for &h in handles.iter() {
                    ctx.flows[*flow].delivered += drain(stack, h, &mut ctx.scratch);
                }
                None
            }
            App::ShortSender {
                remote,
                interval,
                bytes,
                hold,
                until,
                next_open,
                active,
                held,
            } => {
                let before_until = |t: Instant| until.is_none_or(|u| t <= u);
                while *next_open <= now && before_until(*next_open) {
                    if let Ok(handle) = stack.connect(*remote) {
                        active.push(ShortConnection {
                            handle,
                            started: now,
                            written: 0,
                        });
                        ctx.short_started += 1;
                    }
                    *next_open += *interval;
                }
                while let Some(&(close_at, handle)) = held.front() {
                    if close_at > now {
                        break;
                    }
                    let _ = stack.close(handle);
                    held.pop_front();
                }
                active.retain_mut(|c| {
                    if c.written < *bytes {
                        c.written += write_up_to(stack, c.handle, *bytes - c.written);
                    }
                    let Some(conn) = stack.connection(c.handle) else {
                        return false;
                    };
                    if conn.error().is_some() {
                        let _ = stack.close(c.handle);
                        return false;
                    }
                    if c.written == *bytes
                        && conn.send_queue() == 0
                        && conn.state().is_synchronized()
                    {
                        ctx.short_fct_ms
                            .push((now - c.started).as_secs_f64() * 1000.0);
                        if hold.is_zero() {
                            let _ = stack.close(c.handle);
                        } else {
                            held.push_back((now + *hold, c.handle));
                        }
                        return false;
                    }
                    true
                });
                let next_close = held.front().map(|&(at, _)| at);
                let next_open = before_until(*next_open).then_some(*next_open);
                next_open.into_iter().chain(next_close).min()
            }
            App::ShortReceiver { port } => {
                // A connection accepted now may have had its data and FIN already.
                while let Some(h) = stack.accept(*port) {
                    serve_short(stack, h, &mut ctx.scratch);
                }
                for event in events {
                    if let Event::Ready(h, _) = *event {
                        if stack
                            .connection(h)
                            .is_some_and(|c| c.local().port() == *port)
                        {
                            serve_short(stack, h, &mut ctx.scratch);
                        }
                    }
                }
                None
            }
        }
    }
}
