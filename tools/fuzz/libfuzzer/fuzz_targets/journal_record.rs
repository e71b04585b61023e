#![no_main]
// The decoder check of quire_fuzz's "journal_record" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("journal_record").expect("target").check)(data));
