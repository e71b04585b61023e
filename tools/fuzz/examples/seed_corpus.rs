//! Writes each fuzz target's seeds into `tools/fuzz/corpus/<target>/seed-N` where that
//! directory has no file yet, so a first libFuzzer run (run.sh) starts from valid inputs.

fn main() -> std::io::Result<()> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    for t in quire_fuzz::TARGETS {
        let dir = root.join(t.name);
        std::fs::create_dir_all(&dir)?;
        if std::fs::read_dir(&dir)?.next().is_some() {
            continue;
        }
        for (i, s) in (t.seeds)().iter().enumerate() {
            std::fs::write(dir.join(format!("seed-{i}")), s)?;
        }
        println!("{}: {} seeds written", t.name, (t.seeds)().len());
    }
    Ok(())
}
