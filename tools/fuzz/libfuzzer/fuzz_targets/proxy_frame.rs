#![no_main]
// The decoder check of quire_fuzz's "proxy_frame" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("proxy_frame").expect("target").check)(data));
