//! Goal: fencing holds against an add that is parked waiting for write-cache room. BookKeeper's
//! rule: once a bookie has answered a fence for a ledger, it must not acknowledge a later normal
//! (non-recovery) add to that ledger, or recovery can close the ledger before an entry the old
//! writer saw acknowledged. An add that passed the fenced check and then waited for a checkpoint
//! (`wait_for_write_cache_room`) must be refused with `Fenced` if a fence completed meanwhile.
//! Method: a real engine on O_DIRECT files under /tmp with a 256 KiB write cache and bulk
//! writes paced at 512 KiB/s (a checkpoint of a full cache takes about half a second). A writer
//! adds 16 KiB entries to ledger 1 back to back until one of its adds is parked waiting for
//! cache room (`write_cache_waits() > 0`); then the ledger is fenced (fences do not wait for
//! cache room). The parked add's outcome is checked once the checkpoint lets it go on.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use crate::common::{add_payload, run, slow_checkpoint_config, tempdir, KEY};
use quire_engine::Engine;

const ENTRY_BYTES: usize = 16 << 10;
const CACHE_BYTES: usize = 256 << 10;

/// (entry, fence already answered when the add was issued, result) per add, in order.
type Outcomes = Rc<RefCell<Vec<(u64, bool, Result<(), String>)>>>;

#[test]
fn an_add_parked_for_write_cache_room_is_refused_after_a_fence() {
    let dir = tempdir();
    let cfg = slow_checkpoint_config(dir.path(), CACHE_BYTES);
    run(move || async move {
        let engine = Rc::new(Engine::open(cfg).await.unwrap());
        let fence_done = Rc::new(Cell::new(false));
        let outcomes: Outcomes = Rc::default();
        let writer = {
            let (engine, fence_done, outcomes) =
                (engine.clone(), fence_done.clone(), outcomes.clone());
            glommio::spawn_local(async move {
                for e in 0..200u64 {
                    let issued_after_fence = fence_done.get();
                    let r = add_payload(&engine, 1, e, ENTRY_BYTES).await;
                    let failed = r.is_err();
                    outcomes.borrow_mut().push((
                        e,
                        issued_after_fence,
                        r.map_err(|err| format!("{err:?}")),
                    ));
                    if failed {
                        break;
                    }
                }
            })
        };
        // Wait (by yielding, not by time) until the writer's add is parked for cache room.
        while engine.write_cache_waits() == 0 {
            glommio::yield_if_needed().await;
            glommio::timer::sleep(std::time::Duration::from_millis(1)).await;
        }
        let parked_entry = outcomes.borrow().len() as u64;
        let lac_at_fence = engine.fence(1, KEY).await.unwrap();
        fence_done.set(true);
        writer.await;
        let outcomes = outcomes.borrow().clone();
        let parked = outcomes
            .iter()
            .find(|(e, _, _)| *e == parked_entry)
            .expect("the parked add finished");
        assert!(
            matches!(&parked.2, Err(msg) if msg.contains("Fenced")),
            "entry {parked_entry} of ledger 1 was parked for write-cache room when the fence \
             (answered with LAC {lac_at_fence:?}) was issued, yet its add returned {:?}: the \
             bookie acknowledged an add after answering a fence",
            parked.2
        );
        // Whatever came back, nothing after the parked add may be acknowledged either.
        for (e, _, r) in outcomes.iter().filter(|(e, _, _)| *e > parked_entry) {
            assert!(r.is_err(), "entry {e} acknowledged after the fence");
        }
        Rc::try_unwrap(engine).ok().unwrap().close().await.unwrap();
    });
}
