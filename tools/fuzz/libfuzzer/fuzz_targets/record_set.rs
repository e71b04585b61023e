#![no_main]
// The decoder check of quire_fuzz's "record_set" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("record_set").expect("target").check)(data));
