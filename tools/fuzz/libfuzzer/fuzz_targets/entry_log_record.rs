#![no_main]
// The decoder check of quire_fuzz's "entry_log_record" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("entry_log_record").expect("target").check)(data));
