#![no_main]
// The decoder check of quire_fuzz's "tombstone_group" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("tombstone_group").expect("target").check)(data));
