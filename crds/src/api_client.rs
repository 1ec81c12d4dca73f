//! How every hoststack part talks to the API server: no call waits without bound.
//!
//! kube's client connects within 30 s and sends within 295 s, but waits for an answer as long
//! as the connection stays open: a pooled connection whose peer vanished (a restarted load
//! balancer, a dropped NAT entry, a stalled API server) hangs a reconcile or a heartbeat until
//! TCP gives up, many minutes later. [`bounded`] sets a read timeout, counted from when each
//! request was sent and from each byte of the answer, so such a call fails and the next one
//! opens a new connection. A watch is an answer that may rightly stay quiet: [`watch_config`]
//! asks for bookmarks, which the API server's watch cache sends on every watch once a minute
//! (measured in the lab: 60 s apart, to the second), so a live watch never goes
//! [`READ_TIMEOUT`] without a byte and a dead one is noticed within it. Where no bookmarks come
//! (a resource served without the watch cache), a quiet watch is ended by the read timeout and
//! opened again: the cost of a shorter watch, never a missed event.

use std::time::Duration;

/// How long opening a connection may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long sending a request may take.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(15);
/// How long an answer may go without a byte, counted from when the request was sent. Above
/// the API server's own limit for a request (`--request-timeout`, 60 s), which answers first,
/// and above the minute between two bookmarks of a quiet watch.
pub const READ_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the API server keeps a watch open (its `timeoutSeconds`): each agent opens its
/// watch again this often (kube's watcher also gives up on a watch silent for this long and
/// 5 s more, which the read timeout makes moot).
pub const WATCH_TIMEOUT_SECONDS: u32 = 1_800;
/// The longest the API server waits between two bookmarks on a watch that has no events.
pub const BOOKMARK_INTERVAL: Duration = Duration::from_secs(60);

/// `config` with every call bounded: [`CONNECT_TIMEOUT`], [`WRITE_TIMEOUT`] and
/// [`READ_TIMEOUT`], the last counted from each request's sending (not from when its pooled
/// connection fell idle).
pub fn bounded(mut config: kube::Config) -> kube::Config {
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config.write_timeout = Some(WRITE_TIMEOUT);
    config.read_timeout = Some(READ_TIMEOUT);
    config.reset_reader_on_write = true;
    config
}

/// A watcher's configuration with bookmarks (which keep a quiet watch inside
/// [`READ_TIMEOUT`]), whose watches the API server ends after [`WATCH_TIMEOUT_SECONDS`].
pub fn watch_config() -> kube::runtime::watcher::Config {
    kube::runtime::watcher::Config {
        bookmarks: true,
        ..Default::default()
    }
    .timeout(WATCH_TIMEOUT_SECONDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_is_bounded_and_a_quiet_watch_hears_from_the_server_within_the_read_timeout() {
        let config = bounded(kube::Config::new(
            "https://198.18.0.1:6443".parse().unwrap(),
        ));
        assert_eq!(config.connect_timeout, Some(CONNECT_TIMEOUT));
        assert_eq!(config.write_timeout, Some(WRITE_TIMEOUT));
        assert_eq!(config.read_timeout, Some(READ_TIMEOUT));
        assert!(config.reset_reader_on_write);
        let watch = watch_config();
        assert_eq!(watch.timeout, Some(WATCH_TIMEOUT_SECONDS));
        assert!(watch.bookmarks);
        assert!(BOOKMARK_INTERVAL < READ_TIMEOUT);
    }

    /// A server that accepts connections and never answers, as a dead connection behaves:
    /// a call fails once the read timeout has passed (on the test's paused clock), where kube's
    /// default client would wait for ever.
    #[tokio::test(start_paused = true)]
    async fn a_call_to_a_server_that_never_answers_fails_after_the_read_timeout() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let _server = tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        let url = format!("http://{address}").parse().unwrap();
        let client = kube::Client::try_from(bounded(kube::Config::new(url))).unwrap();
        let api = kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client, "x");
        let sent = tokio::time::Instant::now();
        let answer = tokio::time::timeout(READ_TIMEOUT * 4, api.get_opt("y")).await;
        assert!(
            matches!(answer, Ok(Err(_))),
            "the call was not failed by its own timeout: {answer:?}"
        );
        assert!(sent.elapsed() >= READ_TIMEOUT, "{:?}", sent.elapsed());
    }
}
