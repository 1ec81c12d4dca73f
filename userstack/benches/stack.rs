//! Criterion benchmarks: two stack instances joined by an in-memory link on one thread.
//! (a) bulk transfer, (b) 64-byte request/response — each beside smoltcp in the same harness
//! with the same segment size — (c) connection churn with 10,000 live connections. The
//! simulator's speed is userstack-sim's benchmark. Figures go to docs/userstack.md, never into
//! assertions.

#[path = "../tests/support/pair.rs"]
mod pair;

use core::time::Duration;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pair::{Pair, IP_B};
use std::hint::black_box;
use std::net::SocketAddrV4;
use userstack::tcp::Config;

fn bulk_config() -> Config {
    Config {
        recv_buffer: 4 << 20,
        send_buffer: 4 << 20,
        ..Config::default()
    }
}

fn bulk(c: &mut Criterion) {
    const BYTES: usize = 4 << 20;
    let mut group = c.benchmark_group("bulk_1448");
    group.throughput(Throughput::Bytes(BYTES as u64));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    let data = vec![0x42u8; 256 * 1024];
    let mut sink = vec![0u8; 256 * 1024];

    for (name, offload) in [("userstack", false), ("userstack_checksum_offload", true)] {
        let mut pair = Pair::with_offload(bulk_config(), offload);
        pair.b.listen(80, 16).unwrap();
        let (client, server) = pair.connect(80);
        group.bench_function(BenchmarkId::new(name, BYTES), |bench| {
            bench.iter(|| {
                let (mut sent, mut got) = (0, 0);
                while got < BYTES {
                    if sent < BYTES {
                        sent += pair
                            .a
                            .send(client, &data[..data.len().min(BYTES - sent)])
                            .unwrap();
                    }
                    pair.step();
                    loop {
                        let n = pair.b.recv(server, &mut sink).unwrap();
                        if n == 0 {
                            break;
                        }
                        got += n;
                    }
                }
                black_box(got)
            })
        });
    }

    for (name, offload) in [("smoltcp", false), ("smoltcp_checksum_offload", true)] {
        let mut smol = smol::Pair::new(4 << 20, 1502, true, offload);
        group.bench_function(BenchmarkId::new(name, BYTES), |bench| {
            bench.iter(|| black_box(smol.bulk(BYTES, &data, &mut sink)))
        });
    }
    group.finish();
}

fn request_response(c: &mut Criterion) {
    const TRANSACTIONS: u64 = 1000;
    let mut group = c.benchmark_group("rr_64");
    group.throughput(Throughput::Elements(TRANSACTIONS));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    let request = [7u8; 64];
    let mut buf = [0u8; 64];

    let mut pair = Pair::new(Config {
        nagle: false,
        recv_buffer: 64 << 10,
        send_buffer: 64 << 10,
        ..Config::default()
    });
    pair.b.listen(80, 16).unwrap();
    let (client, server) = pair.connect(80);
    group.bench_function("userstack", |bench| {
        bench.iter(|| {
            for _ in 0..TRANSACTIONS {
                pair.a.send(client, &request).unwrap();
                let mut got = 0;
                while got < 64 {
                    pair.step();
                    got += pair.b.recv(server, &mut buf[got..]).unwrap();
                }
                pair.b.send(server, &buf).unwrap();
                let mut back = 0;
                while back < 64 {
                    pair.step();
                    back += pair.a.recv(client, &mut buf[back..]).unwrap();
                }
            }
        })
    });

    let mut smol = smol::Pair::new(64 << 10, 1502, false, false);
    group.bench_function("smoltcp", |bench| {
        bench.iter(|| black_box(smol.request_response(TRANSACTIONS, &request)))
    });
    group.finish();
}

fn churn(c: &mut Criterion) {
    const LIVE: usize = 10_000;
    let mut group = c.benchmark_group("churn");
    group.throughput(Throughput::Elements(1));
    group
        .sample_size(10)
        .measurement_time(Duration::from_secs(4));
    let config = Config {
        recv_buffer: 4096,
        send_buffer: 4096,
        msl: Duration::from_micros(5),
        ..Config::default()
    };
    let mut pair = Pair::new(config);
    pair.b.listen(80, 4096).unwrap();
    pair.b.listen(81, 16).unwrap();
    for _ in 0..LIVE {
        pair.a.connect(SocketAddrV4::new(IP_B, 80)).unwrap();
        if pair.a.connection_count().is_multiple_of(512) {
            while pair.step() > 0 {}
            while pair.b.accept(80).is_some() {}
        }
    }
    while pair.step() > 0 {}
    while pair.b.accept(80).is_some() {}
    assert!(
        pair.b.connection_count() >= LIVE,
        "{} live",
        pair.b.connection_count()
    );
    group.bench_function(BenchmarkId::new("open_close_with_live", LIVE), |bench| {
        bench.iter(|| {
            let (client, server) = pair.connect(81);
            pair.a.close(client).unwrap();
            pair.step();
            pair.b.close(server).unwrap();
            while pair.step() > 0 {}
            pair.now += Duration::from_micros(20);
            pair.a.poll_timers(pair.now);
        })
    });
    group.finish();
}

/// smoltcp in the same harness: two interfaces joined by in-memory queues.
mod smol {
    use smoltcp::iface::{Config, Interface, SocketHandle, SocketSet};
    use smoltcp::phy::{
        ChecksumCapabilities, Device, DeviceCapabilities, Medium, RxToken, TxToken,
    };
    use smoltcp::socket::tcp;
    use smoltcp::time::Instant;
    use smoltcp::wire::{EthernetAddress, IpAddress, IpCidr};
    use std::cell::RefCell;
    use std::collections::VecDeque;
    use std::rc::Rc;

    type Queue = Rc<RefCell<VecDeque<Vec<u8>>>>;

    /// One end of the in-memory link.
    pub struct MemDevice {
        rx: Queue,
        tx: Queue,
        mtu: usize,
        offload: bool,
    }

    pub struct Rx(Vec<u8>);
    pub struct Tx(Queue);

    impl RxToken for Rx {
        fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
            f(&self.0)
        }
    }

    impl TxToken for Tx {
        fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
            let mut buf = vec![0u8; len];
            let r = f(&mut buf);
            self.0.borrow_mut().push_back(buf);
            r
        }
    }

    impl Device for MemDevice {
        type RxToken<'a> = Rx;
        type TxToken<'a> = Tx;

        fn receive(&mut self, _: Instant) -> Option<(Rx, Tx)> {
            let frame = self.rx.borrow_mut().pop_front()?;
            Some((Rx(frame), Tx(self.tx.clone())))
        }

        fn transmit(&mut self, _: Instant) -> Option<Tx> {
            Some(Tx(self.tx.clone()))
        }

        fn capabilities(&self) -> DeviceCapabilities {
            let mut caps = DeviceCapabilities::default();
            caps.medium = Medium::Ethernet;
            caps.max_transmission_unit = self.mtu;
            if self.offload {
                caps.checksum = ChecksumCapabilities::ignored();
            }
            caps
        }
    }

    struct End {
        iface: Interface,
        device: MemDevice,
        sockets: SocketSet<'static>,
        socket: SocketHandle,
    }

    pub struct Pair {
        a: End,
        b: End,
        now: i64,
    }

    #[allow(clippy::too_many_arguments)]
    fn end(
        mac: u8,
        ip: u8,
        rx: Queue,
        tx: Queue,
        mtu: usize,
        buffer: usize,
        bulk: bool,
        offload: bool,
    ) -> End {
        let mut device = MemDevice {
            rx,
            tx,
            mtu,
            offload,
        };
        let config = Config::new(EthernetAddress([2, 0, 0, 0, 0, mac]).into());
        let mut iface = Interface::new(config, &mut device, Instant::from_micros(0));
        iface.update_ip_addrs(|addrs| {
            addrs
                .push(IpCidr::new(IpAddress::v4(198, 18, 0, ip), 24))
                .unwrap();
        });
        let mut socket = tcp::Socket::new(
            tcp::SocketBuffer::new(vec![0; buffer]),
            tcp::SocketBuffer::new(vec![0; buffer]),
        );
        if !bulk {
            socket.set_nagle_enabled(false);
            socket.set_ack_delay(None);
        }
        let mut sockets = SocketSet::new(vec![]);
        let socket = sockets.add(socket);
        End {
            iface,
            device,
            sockets,
            socket,
        }
    }

    impl Pair {
        /// Connected client (a) and server (b).
        pub fn new(buffer: usize, mtu: usize, bulk: bool, offload: bool) -> Pair {
            let ab: Queue = Rc::default();
            let ba: Queue = Rc::default();
            let a = end(1, 1, ba.clone(), ab.clone(), mtu, buffer, bulk, offload);
            let b = end(2, 2, ab, ba, mtu, buffer, bulk, offload);
            let mut pair = Pair { a, b, now: 0 };
            pair.b
                .sockets
                .get_mut::<tcp::Socket>(pair.b.socket)
                .listen(80)
                .unwrap();
            let cx = pair.a.iface.context();
            pair.a
                .sockets
                .get_mut::<tcp::Socket>(pair.a.socket)
                .connect(cx, (IpAddress::v4(198, 18, 0, 2), 80), 40000)
                .unwrap();
            for _ in 0..100 {
                pair.step();
            }
            assert_eq!(
                pair.a.sockets.get::<tcp::Socket>(pair.a.socket).state(),
                tcp::State::Established
            );
            pair
        }

        fn step(&mut self) {
            self.now += 5;
            let t = Instant::from_micros(self.now);
            self.a
                .iface
                .poll(t, &mut self.a.device, &mut self.a.sockets);
            self.b
                .iface
                .poll(t, &mut self.b.device, &mut self.b.sockets);
        }

        pub fn bulk(&mut self, bytes: usize, data: &[u8], sink: &mut [u8]) -> usize {
            let (mut sent, mut got) = (0, 0);
            while got < bytes {
                if sent < bytes {
                    let s = self.a.sockets.get_mut::<tcp::Socket>(self.a.socket);
                    sent += s
                        .send_slice(&data[..data.len().min(bytes - sent)])
                        .unwrap_or(0);
                }
                self.step();
                let r = self.b.sockets.get_mut::<tcp::Socket>(self.b.socket);
                while r.can_recv() {
                    got += r.recv_slice(sink).unwrap_or(0);
                }
            }
            got
        }

        pub fn request_response(&mut self, transactions: u64, request: &[u8]) -> u64 {
            let mut buf = [0u8; 64];
            for _ in 0..transactions {
                self.a
                    .sockets
                    .get_mut::<tcp::Socket>(self.a.socket)
                    .send_slice(request)
                    .unwrap();
                let mut got = 0;
                while got < 64 {
                    self.step();
                    got += self
                        .b
                        .sockets
                        .get_mut::<tcp::Socket>(self.b.socket)
                        .recv_slice(&mut buf[got..])
                        .unwrap_or(0);
                }
                self.b
                    .sockets
                    .get_mut::<tcp::Socket>(self.b.socket)
                    .send_slice(&buf)
                    .unwrap();
                let mut back = 0;
                while back < 64 {
                    self.step();
                    back += self
                        .a
                        .sockets
                        .get_mut::<tcp::Socket>(self.a.socket)
                        .recv_slice(&mut buf[back..])
                        .unwrap_or(0);
                }
            }
            transactions
        }
    }
}

criterion_group!(benches, bulk, request_response, churn);
criterion_main!(benches);
