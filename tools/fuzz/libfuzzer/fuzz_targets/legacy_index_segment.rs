#![no_main]
// The decoder check of quire_fuzz's "legacy_index_segment" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("legacy_index_segment").expect("target").check)(data));
