//! The RSS hash function, key and indirection table through the ethtool ioctl
//! (`SIOCETHTOOL` with `ETHTOOL_GRSSH`), for kernels without `ETHTOOL_MSG_RSS_GET` (it came
//! in Linux 6.2; Debian 12's 6.1 lacks it). Both paths end in the driver's `get_rxfh`.
//!
//! `struct ethtool_rxfh` (include/uapi/linux/ethtool.h) is 24 bytes — `cmd`, `rss_context`,
//! `indir_size`, `key_size` (u32 each), `hfunc` (u8), three reserved bytes, a reserved u32 —
//! followed by `rss_config`: `indir_size` u32 queue numbers, then `key_size` key bytes. A
//! first call with both sizes 0 asks the device for its sizes; a second one with those sizes
//! fetches the table and key.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::codec::Rss;

/// `ETHTOOL_GRSSH`.
const ETHTOOL_GRSSH: u32 = 0x46;
/// The size of `struct ethtool_rxfh` before `rss_config`.
const HEADER: usize = 24;
/// Offsets of its fields.
const INDIR_SIZE: usize = 8;
const KEY_SIZE: usize = 12;
const HFUNC: usize = 16;

/// An `ethtool_rxfh` request for the default context with room for `indir_size` entries and
/// `key_size` key bytes (both 0: ask for the sizes).
pub fn request(indir_size: u32, key_size: u32) -> Vec<u8> {
    let mut buf = vec![0u8; HEADER + 4 * indir_size as usize + key_size as usize];
    buf[..4].copy_from_slice(&ETHTOOL_GRSSH.to_ne_bytes());
    buf[INDIR_SIZE..INDIR_SIZE + 4].copy_from_slice(&indir_size.to_ne_bytes());
    buf[KEY_SIZE..KEY_SIZE + 4].copy_from_slice(&key_size.to_ne_bytes());
    buf
}

fn u32_at(buf: &[u8], at: usize) -> Result<u32, String> {
    buf.get(at..at + 4)
        .map(|b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| format!("ethtool_rxfh of {} bytes has no u32 at {at}", buf.len()))
}

/// The sizes (indirection entries, key bytes) the device answered the first call with.
pub fn decode_sizes(buf: &[u8]) -> Result<(u32, u32), String> {
    Ok((u32_at(buf, INDIR_SIZE)?, u32_at(buf, KEY_SIZE)?))
}

/// The hash function, table and key of the answer to [`request`] with the device's sizes.
pub fn decode(buf: &[u8]) -> Result<Rss, String> {
    let (indir_size, key_size) = decode_sizes(buf)?;
    let table_end = HEADER + 4 * indir_size as usize;
    let end = table_end + key_size as usize;
    if buf.len() < end {
        return Err(format!(
            "ethtool_rxfh of {} bytes cannot hold {indir_size} entries and a {key_size}-byte key",
            buf.len()
        ));
    }
    Ok(Rss {
        hash_function: u32::from(buf[HFUNC]),
        key: buf[table_end..end].to_vec(),
        indirection: buf[HEADER..table_end]
            .chunks_exact(4)
            .map(|q| u32::from_ne_bytes([q[0], q[1], q[2], q[3]]))
            .collect(),
    })
}

/// One `SIOCETHTOOL` call on `dev` with `buf` as the command buffer.
fn ethtool_ioctl(socket: &OwnedFd, dev: &str, buf: &mut [u8]) -> io::Result<()> {
    // SAFETY: a zeroed ifreq is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if dev.len() >= ifr.ifr_name.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{dev:?} is not an interface name"),
        ));
    }
    for (slot, byte) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
        *slot = byte as libc::c_char;
    }
    ifr.ifr_ifru.ifru_data = buf.as_mut_ptr().cast();
    // SAFETY: ifr names the device and points at buf, which is as large as the sizes in it
    // say; the kernel writes only within them.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), libc::SIOCETHTOOL, &mut ifr) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// The RSS of `dev` through the ioctl: `None` when the device has none (`EOPNOTSUPP`).
pub fn read(dev: &str) -> io::Result<Option<Rss>> {
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor nobody else owns.
    let socket = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut sizes = request(0, 0);
    match ethtool_ioctl(&socket, dev, &mut sizes) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return Ok(None),
        Err(e) => return Err(e),
    }
    let (indir_size, key_size) =
        decode_sizes(&sizes).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
    if indir_size == 0 && key_size == 0 {
        return Ok(None);
    }
    let mut buf = request(indir_size, key_size);
    ethtool_ioctl(&socket, dev, &mut buf)?;
    decode(&buf)
        .map(Some)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_the_command_and_the_sizes() {
        let ask = request(0, 0);
        assert_eq!(ask.len(), 24);
        assert_eq!(&ask[..4], &0x46u32.to_ne_bytes());
        assert_eq!(decode_sizes(&ask).expect("sizes"), (0, 0));
        let fetch = request(128, 40);
        assert_eq!(fetch.len(), 24 + 512 + 40);
        assert_eq!(decode_sizes(&fetch).expect("sizes"), (128, 40));
    }

    #[test]
    fn an_answer_decodes_into_function_table_and_key() {
        // As virtio_net fills it: Toeplitz, 4 entries over 2 queues, an 8-byte key.
        let mut answer = request(4, 8);
        answer[HFUNC] = 1;
        for (i, q) in [0u32, 1, 0, 1].iter().enumerate() {
            answer[HEADER + 4 * i..HEADER + 4 * i + 4].copy_from_slice(&q.to_ne_bytes());
        }
        answer[HEADER + 16..].copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        let rss = decode(&answer).expect("rss");
        assert!(rss.is_toeplitz());
        assert_eq!(rss.indirection, [0, 1, 0, 1]);
        assert_eq!(rss.key, [1, 2, 3, 4, 5, 6, 7, 8]);
        let error = decode(&answer[..30]).unwrap_err();
        assert!(error.contains("cannot hold 4 entries"), "{error}");
    }

    #[test]
    fn loopback_has_no_rss_and_a_missing_device_is_an_error() {
        assert_eq!(read("lo").expect("GRSSH of lo"), None);
        assert_eq!(
            read("hs-no-such-dev").unwrap_err().raw_os_error(),
            Some(libc::ENODEV)
        );
    }
}
