//! The command channel into a VM node: files in the node's writable 9p share.
//!
//! The host drops a script as `cmd/<n>.sh` (run by the host's `/bin/sh` inside the guest's
//! chroot of the host root, so with the host's tools — ip, ethtool, dpdk-testpmd — on the
//! guest's kernel) or `cmd/<n>.bb` (run by the initramfs' busybox, outside the chroot: power
//! off). The guest's runner (`/etc/hoststack-runner`, see [`super::initramfs`]) polls the
//! directory every 200 ms, renames the request to `<n>.run`, runs it in the background and
//! leaves `<n>.out`, `<n>.err` and, last, `<n>.rc` (the exit status). Requests run
//! concurrently, so a long one (testpmd) never blocks the others. The host waits for a request
//! as long as its budget of the guest's progress lasts (see [`super::progress`]).

use super::progress::Heartbeat;
use crate::{Error, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Where a request runs in the guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Shell {
    /// The host's /bin/sh in the chroot of the host root (the host's tools).
    HostTools,
    /// The initramfs' busybox sh.
    Busybox,
}

/// What a guest command printed and how it exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GuestOutput {
    /// Exit status of the script.
    pub status: i32,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

impl GuestOutput {
    /// Whether the script exited 0.
    pub fn success(&self) -> bool {
        self.status == 0
    }
}

/// The host's end of the channel.
#[derive(Debug)]
pub(crate) struct Channel {
    dir: PathBuf,
    heartbeat: Heartbeat,
    next: AtomicU64,
}

impl Channel {
    /// The channel in `dir` (the share's `cmd/`), which it creates; the guest's heartbeat is
    /// beside it.
    pub fn create(dir: PathBuf, heartbeat: Heartbeat) -> Result<Channel> {
        std::fs::create_dir_all(&dir)
            .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        Ok(Channel {
            dir,
            heartbeat,
            next: AtomicU64::new(1),
        })
    }

    /// Removes every request and answer (after the guest's power was cut, none will be
    /// answered).
    pub fn clear(&self) -> Result<()> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("listing {}", self.dir.display()), e))?;
        for entry in entries.flatten() {
            std::fs::remove_file(entry.path())
                .map_err(|e| Error::io(format!("removing {}", entry.path().display()), e))?;
        }
        Ok(())
    }

    /// Hands `script` to the guest without waiting for it.
    pub fn submit(&self, script: &str, shell: Shell) -> Result<u64> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let ext = match shell {
            Shell::HostTools => "sh",
            Shell::Busybox => "bb",
        };
        let tmp = self.dir.join(format!("{n}.tmp"));
        std::fs::write(&tmp, script)
            .map_err(|e| Error::io(format!("writing {}", tmp.display()), e))?;
        let request = self.dir.join(format!("{n}.{ext}"));
        std::fs::rename(&tmp, &request)
            .map_err(|e| Error::io(format!("renaming to {}", request.display()), e))?;
        Ok(n)
    }

    /// Runs `script` and waits for it to finish while `budget`'s worth of the guest's progress
    /// lasts.
    pub fn run(&self, script: &str, shell: Shell, budget: Duration) -> Result<GuestOutput> {
        let n = self.submit(script, shell)?;
        let rc = self.dir.join(format!("{n}.rc"));
        let mut progress = self.heartbeat.budget(budget);
        while !rc.exists() {
            if let Err(why) = progress.check() {
                return Err(Error::Guest {
                    what: format!(
                        "the guest did not finish {script:?} (request {n}, budget {budget:?})"
                    ),
                    why,
                });
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let read = |ext: &str| {
            let path = self.dir.join(format!("{n}.{ext}"));
            let text = std::fs::read_to_string(&path)
                .map_err(|e| Error::io(format!("reading {}", path.display()), e));
            let _ = std::fs::remove_file(&path);
            text
        };
        let status = read("rc")?;
        let output = GuestOutput {
            status: status
                .trim()
                .parse()
                .map_err(|_| Error::Setup(format!("request {n}: exit status {status:?}")))?,
            stdout: read("out")?,
            stderr: read("err")?,
        };
        let _ = std::fs::remove_file(self.dir.join(format!("{n}.run")));
        Ok(output)
    }
}
