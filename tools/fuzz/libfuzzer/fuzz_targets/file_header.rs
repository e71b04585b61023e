#![no_main]
// The decoder check of quire_fuzz's "file_header" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("file_header").expect("target").check)(data));
