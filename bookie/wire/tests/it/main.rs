//! The bookie wire codec's tests, linked into one test binary.

// Integration tests run real processes, runtimes and sockets and wait on real deadlines: they
// read the real clock, not the quire_clock seam (clippy.toml, ARCHITECTURE.md).
#![allow(clippy::disallowed_methods)]

mod bookie_info_codec;
mod decoder_rejects_bad_frames;
mod long_poll_response_codec;
mod recv_buffer_moves_each_byte_once;
