#![no_main]
// The decoder check of quire_fuzz's "index_segment_block" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("index_segment_block").expect("target").check)(data));
