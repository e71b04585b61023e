//! The record of the common replicated-log workload (the team's shared reference workload.md,
//! "Record"): the same bytes every load generator of that comparison writes.
//!
//! Layout (little-endian), `size` bytes in all (1024 by default, not counting framing):
//! ```text
//! 0..8    CLOCK_MONOTONIC time in ns, taken just before the append call
//! 8..16   sequence number, from 0 per log
//! 16..    filler: the xorshift64 stream (shifts 13, 7, 17) seeded from the sequence number
//!         (seed = seq · 0x9E3779B97F4A7C15, lowest bit set so it is never 0), one u64 per
//!         8 bytes; a last partial word is filled with the low byte of the last state
//! ```
//! The filler does not compress, so no layer can shortcut it; with this seed the bytes are the
//! ones ../shared/bench's load generator writes for the same (stamp, seq).

/// Bytes of the stamp and sequence number; a record is at least this large.
pub const RECORD_HEADER_SIZE_BYTES: usize = 16;

/// Multiplier that spreads consecutive sequence numbers over the seed space (2^64 / φ).
const SEED_MULTIPLIER: u64 = 0x9E37_79B9_7F4A_7C15;

/// CLOCK_MONOTONIC in nanoseconds: the clock of the record stamp, comparable across threads
/// and across processes of the same host (a tailing reader in another process can subtract).
pub fn mono_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid pointer to a timespec we own; CLOCK_MONOTONIC exists on every Linux.
    unsafe {
        libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts);
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// One step of Marsaglia's xorshift64 (13, 7, 17).
pub fn xorshift64(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// The filler's seed for record `seq` (never 0: xorshift would stay at 0).
pub fn filler_seed(seq: u64) -> u64 {
    seq.wrapping_mul(SEED_MULTIPLIER) | 1
}

/// Builds record `seq` stamped `stamp_ns`, `size_bytes` long (at least
/// [`RECORD_HEADER_SIZE_BYTES`]; a smaller size still gets the whole header).
pub fn encode(seq: u64, stamp_ns: u64, size_bytes: usize) -> Vec<u8> {
    let size = size_bytes.max(RECORD_HEADER_SIZE_BYTES);
    let mut p = Vec::with_capacity(size);
    p.extend_from_slice(&stamp_ns.to_le_bytes());
    p.extend_from_slice(&seq.to_le_bytes());
    let mut x = filler_seed(seq);
    while p.len() + 8 <= size {
        x = xorshift64(x);
        p.extend_from_slice(&x.to_le_bytes());
    }
    p.resize(size, x as u8);
    p
}

/// `(stamp_ns, seq)` of a record, or `None` when it is shorter than the header (a marker).
pub fn decode(p: &[u8]) -> Option<(u64, u64)> {
    let stamp = u64::from_le_bytes(p.get(0..8)?.try_into().ok()?);
    let seq = u64::from_le_bytes(p.get(8..16)?.try_into().ok()?);
    Some((stamp, seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the header is the stamp then the sequence number, little-endian, and a record has
    // the asked size. Method: encode and look at the bytes.
    #[test]
    fn layout_of_the_header() {
        let p = encode(0x0102, 0x1122_3344_5566_7788, 1024);
        assert_eq!(p.len(), 1024);
        assert_eq!(&p[0..8], &[0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11]);
        assert_eq!(&p[8..16], &[0x02, 0x01, 0, 0, 0, 0, 0, 0]);
        assert_eq!(decode(&p), Some((0x1122_3344_5566_7788, 0x0102)));
        assert_eq!(encode(5, 6, 3).len(), RECORD_HEADER_SIZE_BYTES);
        assert_eq!(decode(b"tail-marker"), None);
        assert_eq!(decode(&p[..15]), None);
    }

    // Goal: the filler is the xorshift64 (13, 7, 17) stream seeded from the sequence number.
    // Method: known values worked out by hand from the definition: seed of seq 0 is 1, and
    // xorshift64(1) = 1 ^ 1<<13 = 0x2001, then ^ >>7 (0x40) = 0x2041, then ^ <<17 = 0x40822041.
    // Record 0's first filler word is that; the next words follow the same recurrence; a
    // 45-byte record (3 whole words) ends in 5 copies of the third word's low byte.
    #[test]
    fn filler_is_the_xorshift_stream() {
        assert_eq!(filler_seed(0), 1);
        assert_eq!(xorshift64(1), 0x4082_2041);
        let p = encode(0, 0, 40);
        let w = |i: usize| u64::from_le_bytes(p[16 + 8 * i..24 + 8 * i].try_into().unwrap());
        assert_eq!(w(0), 0x4082_2041);
        assert_eq!(w(1), xorshift64(0x4082_2041));
        assert_eq!(w(2), xorshift64(w(1)));
        let q = encode(0, 0, 45);
        assert_eq!(&q[..40], &p[..40]);
        assert_eq!(&q[40..45], &[w(2) as u8; 5]);
        assert_eq!(filler_seed(3), 3u64.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    }

    // Goal: the filler does not compress and differs between records. Method: no byte value
    // takes more than 2% of a 1 KiB record's filler (a run of equal bytes or a short cycle
    // would), and records 1 and 2 share no filler word.
    #[test]
    fn filler_is_incompressible_and_per_record() {
        let p = encode(1, 0, 1024);
        let mut counts = [0u32; 256];
        for b in &p[16..] {
            counts[*b as usize] += 1;
        }
        assert!(counts.iter().all(|&c| c < 20), "{:?}", counts.iter().max());
        let q = encode(2, 0, 1024);
        for i in (16..1024).step_by(8) {
            assert_ne!(p[i..i + 8], q[i..i + 8], "word at {i}");
        }
    }

    // Goal: the stamp clock is CLOCK_MONOTONIC in ns: it never goes back and moves with
    // std's Instant (the same clock on Linux). Method: two readings around a 1 ms sleep.
    #[test]
    fn stamp_clock_moves_forward() {
        let a = mono_ns();
        let t = quire_clock::now();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let el = quire_clock::elapsed(t).as_nanos() as u64;
        let b = mono_ns();
        assert!(b >= a + 1_000_000, "{a} {b}");
        assert!(b - a >= el / 2, "{} vs {el}", b - a);
    }
}
