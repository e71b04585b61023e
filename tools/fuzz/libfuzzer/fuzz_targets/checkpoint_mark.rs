#![no_main]
// The decoder check of quire_fuzz's "checkpoint_mark" target (see tools/fuzz/src/lib.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| (quire_fuzz::target("checkpoint_mark").expect("target").check)(data));
