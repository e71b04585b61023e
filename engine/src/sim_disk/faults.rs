//! Storage faults of the simulated disk (issue 28 item 3): besides crashes, a real device
//! returns flipped bits, fails reads and writes with EIO, acknowledges a flush it did not do,
//! and writes a block to the wrong place (the faults of "Redundancy does not imply fault
//! tolerance", FAST '17, and of the NATS 2.12 and Redpanda Jepsen analyses). Each fault here is
//! armed for the n-th matching operation from now and fires once; the bit it flips is drawn from
//! the disk's seed. [`super::SimStorage::fault_log`] lists what fired.
//!
//! The torn write in the middle of a page is a crash tear mode instead
//! ([`super::TEAR_HOLE`]): the sectors of the last unsynced write on both sides of a hole reach
//! the medium, those in the hole do not.

use std::io;
use std::path::Path;

/// A fault to inject, on reads, writes or fdatasyncs of the files a filter accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// A read returns its bytes with one seeded bit flipped; the medium is unchanged, so the
    /// next read is right (a flip on the bus or in a controller's cache).
    ReadBitFlip,
    /// A read fails with EIO (an unreadable sector); the medium is unchanged.
    ReadEio,
    /// A write fails with EIO; nothing of it reaches the file.
    WriteEio,
    /// An fdatasync reports success but makes nothing durable (a device that acknowledges a
    /// flush it did not do); the file's writes stay unsynced, so a crash before the file's
    /// next (honest) fdatasync drops them.
    LostSync,
    /// A write lands `blocks` 4 KiB blocks away from where it was asked (a misdirected write),
    /// reported as a success; the intended place keeps its old bytes. A negative shift that
    /// would land before the file's start lands that far after it instead.
    Misdirect { blocks: i64 },
}

impl Fault {
    fn on(self) -> On {
        match self {
            Fault::ReadBitFlip | Fault::ReadEio => On::Read,
            Fault::WriteEio | Fault::Misdirect { .. } => On::Write,
            Fault::LostSync => On::Sync,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum On {
    Read,
    Write,
    Sync,
}

/// Which files a fault applies to (their path as opened or last renamed).
pub type PathFilter = Box<dyn Fn(&Path) -> bool>;

struct ArmedFault {
    fault: Fault,
    left: u64,
    filter: PathFilter,
}

/// The faults armed on one disk, and what fired.
#[derive(Default)]
pub(super) struct Faults {
    armed: Vec<ArmedFault>,
    pub(super) fired: Vec<String>,
}

/// What a write must do instead of landing where asked.
pub(super) enum WriteFault {
    Eio,
    LandAt(u64),
}

/// EIO as the kernel reports it (`raw_os_error() == Some(5)` on Linux).
pub(super) fn eio() -> io::Error {
    io::Error::from_raw_os_error(5)
}

impl Faults {
    pub(super) fn arm(&mut self, fault: Fault, nth: u64, filter: PathFilter) {
        assert!(nth >= 1, "a fault is armed for a later operation");
        self.armed.push(ArmedFault {
            fault,
            left: nth,
            filter,
        });
    }

    /// Counts one operation of kind `on` on `path`; returns the fault that fires in it, if any.
    pub(super) fn fire(&mut self, on: On, path: &Path, what: &str) -> Option<Fault> {
        let mut fired = None;
        for a in &mut self.armed {
            if fired.is_none() && a.left > 0 && a.fault.on() == on && (a.filter)(path) {
                a.left -= 1;
                if a.left == 0 {
                    fired = Some(a.fault);
                }
            }
        }
        self.armed.retain(|a| a.left > 0);
        if let Some(f) = fired {
            self.fired.push(format!("{f:?} in {what}"));
        }
        fired
    }
}

/// Flips bit `bit % (8 * len)` of `data` (nothing if empty); returns the byte offset flipped.
pub(super) fn flip(data: &mut [u8], bit: u64) -> Option<usize> {
    if data.is_empty() {
        return None;
    }
    let bit = (bit % (data.len() as u64 * 8)) as usize;
    data[bit / 8] ^= 1 << (bit % 8);
    Some(bit / 8)
}

/// Where a misdirected write of `len` bytes asked at `pos` lands.
pub(super) fn misdirected(pos: u64, blocks: i64) -> u64 {
    let shift = blocks.unsigned_abs() * crate::io::BLOCK_BYTES as u64;
    if blocks >= 0 || pos < shift {
        pos + shift
    } else {
        pos - shift
    }
}

/// The sectors `from..to` of a write of `sectors` sectors that a hole tear loses (`r` picks
/// them): at least one, never the first nor the last, so both sides of the hole reach the
/// medium. `None` for a write under 3 sectors (no middle).
pub(super) fn hole(sectors: usize, r: u64) -> Option<(usize, usize)> {
    if sectors < 3 {
        return None;
    }
    let inner = (sectors - 2) as u64;
    let from = 1 + (r % inner) as usize;
    let len = 1 + ((r >> 16) % (sectors as u64 - 1 - from as u64)) as usize;
    Some((from, from + len))
}

/// Injection calls of the disk's write path: the fault to apply to a write at `pos`.
pub(super) fn write_fault(f: Option<Fault>, pos: u64) -> Option<WriteFault> {
    match f? {
        Fault::WriteEio => Some(WriteFault::Eio),
        Fault::Misdirect { blocks } => Some(WriteFault::LandAt(misdirected(pos, blocks))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hole_keeps_both_ends_of_the_write() {
        for sectors in 3..=16 {
            for r in 0..500u64 {
                let (a, b) = hole(sectors, r.wrapping_mul(0x9e37_79b9_7f4a_7c15)).unwrap();
                assert!(a >= 1 && b < sectors && a < b, "{sectors} {r}: {a}..{b}");
            }
        }
        assert_eq!(hole(2, 7), None);
    }

    #[test]
    fn a_misdirected_write_never_lands_before_the_file() {
        assert_eq!(misdirected(8192, -1), 4096);
        assert_eq!(misdirected(4096, -2), 4096 + 8192);
        assert_eq!(misdirected(0, 3), 3 * 4096);
    }
}
