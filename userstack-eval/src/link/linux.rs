//! Linux's TCP as either end of the link: bulk senders and a sink, on threads that enter the
//! end's network namespace (`setns`), so that their sockets live there; and the namespace's
//! own counters, read from `/proc/thread-self/net/` by a thread inside it.

use crate::report::Counters;
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How often blocked threads look at the stop flag.
const TICK: Duration = Duration::from_millis(100);
/// Bytes per write and per read.
const CHUNK: usize = 64 * 1024;

/// Moves the calling thread into the network namespace `ns` (made by `ip netns add`).
pub fn enter(ns: &str) -> std::io::Result<()> {
    let file = std::fs::File::open(format!("/run/netns/{ns}"))?;
    // SAFETY: a valid descriptor of a network namespace file.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread inside `ns` and returns what it returns.
pub fn within<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns)?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("a namespace thread panicked"))?
}

/// The TCP counters of namespace `ns` (`/proc/net/snmp` and `/proc/net/netstat` as seen
/// inside it).
pub fn counters(ns: &str) -> std::io::Result<Counters> {
    within(ns, || {
        let mut counters = parse_proc_net(&std::fs::read_to_string("/proc/thread-self/net/snmp")?);
        counters.extend(parse_proc_net(&std::fs::read_to_string(
            "/proc/thread-self/net/netstat",
        )?));
        Ok(counters)
    })
}

/// Parses the `Section: Name Name …` / `Section: value value …` line pairs of
/// `/proc/net/snmp` and `/proc/net/netstat`.
pub fn parse_proc_net(text: &str) -> Counters {
    let mut counters = Counters::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [names, values] = pair else { continue };
        let (Some((section, names)), Some((_, values))) =
            (names.split_once(':'), values.split_once(':'))
        else {
            continue;
        };
        let section = counters.entry(section.to_string()).or_default();
        for (name, value) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(value) = value.parse() {
                section.insert(name.to_string(), value);
            }
        }
    }
    counters
}

/// One accepted connection: the index of its port among the sink's, and the bytes read.
type AcceptedFlow = (usize, Arc<AtomicU64>);

/// Connections that read and drop everything, on listeners in one namespace.
#[derive(Debug)]
pub struct Sink {
    stop: Arc<AtomicBool>,
    /// Bytes read, per connection with the index of the port that accepted it.
    flows: Arc<Mutex<Vec<AcceptedFlow>>>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Sink {
    /// Listens on `ports` of every address in `ns`.
    pub fn start(ns: &str, ports: &[u16]) -> std::io::Result<Sink> {
        let ports = ports.to_vec();
        let listeners = within(ns, move || {
            ports
                .iter()
                .map(|&port| {
                    let listener = TcpListener::bind(("0.0.0.0", port))?;
                    listener.set_nonblocking(true)?;
                    Ok(listener)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })?;
        let sink = Sink {
            stop: Arc::new(AtomicBool::new(false)),
            flows: Arc::new(Mutex::new(Vec::new())),
            threads: Arc::new(Mutex::new(Vec::new())),
        };
        for (port, listener) in listeners.into_iter().enumerate() {
            let (stop, flows, threads) =
                (sink.stop.clone(), sink.flows.clone(), sink.threads.clone());
            let accepting = std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    match listener.accept() {
                        Ok((stream, _)) => {
                            let read = Arc::new(AtomicU64::new(0));
                            flows.lock().unwrap().push((port, read.clone()));
                            let stop = stop.clone();
                            let reader = std::thread::spawn(move || drain(stream, &read, &stop));
                            threads.lock().unwrap().push(reader);
                        }
                        Err(e) if e.kind() == ErrorKind::WouldBlock => std::thread::sleep(TICK),
                        Err(_) => std::thread::sleep(TICK),
                    }
                }
            });
            sink.threads.lock().unwrap().push(accepting);
        }
        Ok(sink)
    }

    /// Bytes read so far, per connection: in the order of the ports given to [`Sink::start`]
    /// (so flow *i* of a row with per-flow RTTs is entry *i*), and on one port in the order
    /// accepted.
    pub fn delivered(&self) -> Vec<u64> {
        let mut flows: Vec<(usize, u64)> = self
            .flows
            .lock()
            .unwrap()
            .iter()
            .map(|(port, read)| (*port, read.load(Ordering::Relaxed)))
            .collect();
        flows.sort_by_key(|&(port, _)| port);
        flows.into_iter().map(|(_, read)| read).collect()
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // Readers may start while the accepting threads stop: join until none is left.
        loop {
            let batch: Vec<JoinHandle<()>> = std::mem::take(&mut *self.threads.lock().unwrap());
            if batch.is_empty() {
                break;
            }
            for thread in batch {
                let _ = thread.join();
            }
        }
    }
}

/// Reads `stream` until it ends or `stop`, counting into `read`.
fn drain(mut stream: TcpStream, read: &AtomicU64, stop: &AtomicBool) {
    let _ = stream.set_read_timeout(Some(TICK));
    let mut buffer = vec![0u8; CHUNK];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                read.fetch_add(n as u64, Ordering::Relaxed);
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
}

/// Bulk senders: connections from one namespace that write as fast as they are taken.
#[derive(Debug)]
pub struct Senders {
    stop: Arc<AtomicBool>,
    streams: Vec<Arc<TcpStream>>,
    threads: Vec<JoinHandle<()>>,
}

impl Senders {
    /// Opens one connection from `ns` to each of `targets` and starts writing on all.
    pub fn start(ns: &str, targets: &[SocketAddrV4]) -> std::io::Result<Senders> {
        let targets = targets.to_vec();
        let streams = within(ns, move || {
            targets
                .iter()
                .map(|&to| TcpStream::connect_timeout(&to.into(), Duration::from_secs(10)))
                .collect::<std::io::Result<Vec<_>>>()
        })?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut senders = Senders {
            stop: stop.clone(),
            streams: Vec::new(),
            threads: Vec::new(),
        };
        for stream in streams {
            stream.set_write_timeout(Some(TICK))?;
            let stream = Arc::new(stream);
            senders.streams.push(stream.clone());
            let stop = stop.clone();
            senders.threads.push(std::thread::spawn(move || {
                let chunk = vec![0u8; CHUNK];
                let mut writer: &TcpStream = &stream;
                while !stop.load(Ordering::Relaxed) {
                    match writer.write(&chunk) {
                        Ok(_) => {}
                        Err(e)
                            if matches!(
                                e.kind(),
                                ErrorKind::WouldBlock
                                    | ErrorKind::TimedOut
                                    | ErrorKind::Interrupted
                            ) => {}
                        Err(_) => break,
                    }
                }
            }));
        }
        Ok(senders)
    }

    /// Bytes each connection's peer has acknowledged so far (`tcpi_bytes_acked`).
    pub fn acknowledged(&self) -> std::io::Result<Vec<u64>> {
        self.streams
            .iter()
            .map(|s| Ok(tcp_info(s)?.tcpi_bytes_acked))
            .collect()
    }

    /// The connections' smoothed round-trip times now (`tcpi_rtt`), in microseconds.
    pub fn smoothed_rtts(&self) -> std::io::Result<Vec<u32>> {
        self.streams
            .iter()
            .map(|s| Ok(tcp_info(s)?.tcpi_rtt))
            .collect()
    }

    /// What limited the connections' sending so far, summed over them.
    pub fn limits(&self) -> std::io::Result<SendLimits> {
        let mut sum = SendLimits::default();
        for stream in &self.streams {
            let info = tcp_info(stream)?;
            sum.busy_us += info.tcpi_busy_time;
            sum.rwnd_limited_us += info.tcpi_rwnd_limited;
            sum.sndbuf_limited_us += info.tcpi_sndbuf_limited;
        }
        Ok(sum)
    }
}

/// Linux's account of a sender's time (`TCP_INFO`'s chronograph, in microseconds): sending
/// data at all, and of that, held back by the receiver's window or by the send buffer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SendLimits {
    /// Time with data in flight or queued (`tcpi_busy_time`).
    pub busy_us: u64,
    /// Of that, time the receiver's advertised window stopped it (`tcpi_rwnd_limited`).
    pub rwnd_limited_us: u64,
    /// Of that, time the send buffer stopped it (`tcpi_sndbuf_limited`).
    pub sndbuf_limited_us: u64,
}

impl Drop for Senders {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// `stream`'s `TCP_INFO`.
fn tcp_info(stream: &TcpStream) -> std::io::Result<libc::tcp_info> {
    // SAFETY: tcp_info is plain data; zeroed is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: info and len describe a writable buffer of len bytes.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::counter;

    #[test]
    fn proc_net_pairs_become_counters() {
        let text = "Ip: Forwarding DefaultTTL\nIp: 1 64\nTcp: RtoAlgorithm OutSegs RetransSegs\nTcp: 1 120 7\n";
        let c = parse_proc_net(text);
        assert_eq!(counter(&c, "Tcp", "OutSegs"), 120);
        assert_eq!(counter(&c, "Tcp", "RetransSegs"), 7);
        assert_eq!(counter(&c, "Ip", "DefaultTTL"), 64);
    }

    #[test]
    fn this_machine_has_the_counters_the_tables_read() {
        let mut counters = parse_proc_net(&std::fs::read_to_string("/proc/net/snmp").unwrap());
        counters.extend(parse_proc_net(
            &std::fs::read_to_string("/proc/net/netstat").unwrap(),
        ));
        for (section, name) in [
            ("Tcp", "OutSegs"),
            ("Tcp", "RetransSegs"),
            ("TcpExt", "TCPSackRecovery"),
            ("TcpExt", "TCPRenoRecovery"),
            ("TcpExt", "TCPTimeouts"),
            ("TcpExt", "TCPFullUndo"),
            ("TcpExt", "TCPLossUndo"),
        ] {
            assert!(counters[section].contains_key(name), "{section}.{name}");
        }
    }
}
