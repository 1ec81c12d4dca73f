//! The contract of an applier: what the agent must know to manage one kind of setting. Every
//! kind has exactly one applier, in the table of [`super::applier`].

use std::io;

use crate::host::{Host, Port};
use crate::model::{same_value, Reading};

/// How the settings of one kind are read, written and compared. Values are strings as the
/// kernel prints them (without the trailing newline), so the journal keeps them as read.
pub trait Applier: Sync {
    /// The host ports its reads and writes go through. A host without one of them refuses the
    /// kind before the applier runs ([`super::read()`], [`super::write()`]).
    fn ports(&self) -> &'static [Port];

    /// Reads the setting named `target` from `host`.
    fn read(&self, host: &Host, target: &str) -> Reading;

    /// Writes `value` to the setting named `target` on `host`. The error is what the kernel
    /// said (e.g. EINVAL when it refuses the value).
    fn write(&self, host: &Host, target: &str, value: &str) -> io::Result<()>;

    /// Whether two values are the same setting; by default equal once runs of whitespace are
    /// collapsed and the ends trimmed.
    fn same_value(&self, a: &str, b: &str) -> bool {
        same_value(a, b)
    }

    /// Why a write of `wrote` that read back as `read` did not take.
    fn mismatch(&self, wrote: &str, read: &str) -> String {
        format!("wrote {wrote:?} but read back {read:?}")
    }
}
