use crate::common::{config, payload, run, tempdir, KEY};
use quire_engine::{Engine, Error};

#[test]
fn fenced_ledger_refuses_normal_adds_and_stays_fenced() {
    // Goal: BookKeeper fencing rules. A fenced ledger refuses normal adds with Fenced, accepts
    // recovery adds; fence returns the LAC; a wrong master key gets Unauthorized for adds and
    // fences; the fence survives a crash (it was journaled before `fence` resolved). A fence
    // of a ledger no add bound fences the fencer's key only, through a crash and a checkpoint.
    // Method: add, fence, try adds, crash, reopen, try again.
    let dir = tempdir();
    let cfg = config(dir.path());
    let cfg2 = cfg.clone();
    run(move || async move {
        let e = Engine::open(cfg).await.unwrap();
        e.add_entry(1, 0, KEY, None, payload(1, 0, 10), false)
            .await
            .unwrap();
        e.add_entry(1, 1, KEY, Some(0), payload(1, 1, 10), false)
            .await
            .unwrap();
        assert!(matches!(
            e.add_entry(1, 2, [1; 20], Some(1), payload(1, 2, 10), false)
                .await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        assert!(matches!(
            e.fence(1, [1; 20]).await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        assert!(!e.ledger_state(1).unwrap().fenced);
        assert_eq!(e.fence(1, KEY).await.unwrap(), Some(0));
        assert!(e.ledger_state(1).unwrap().fenced);
        assert!(matches!(
            e.add_entry(1, 2, KEY, Some(1), payload(1, 2, 10), false)
                .await,
            Err(Error::Fenced { ledger: 1 })
        ));
        e.add_entry(1, 2, KEY, Some(1), payload(1, 2, 10), true)
            .await
            .unwrap();
        // Fencing an unknown ledger fences it for the fencer's key only (docs/protocol.md
        // §Fence): a normal add with that key is refused, and the key is not bound.
        assert_eq!(e.fence(2, KEY).await.unwrap(), None);
        assert!(matches!(
            e.add_entry(2, 0, KEY, None, payload(2, 0, 10), false).await,
            Err(Error::Fenced { ledger: 2 })
        ));
        assert!(
            !e.ledger_state(2).unwrap().fenced,
            "no key bound: not fenced for readers"
        );
        // Crash without close.
    });
    run(move || async move {
        let e = Engine::open(cfg2).await.unwrap();
        let s = e.ledger_state(1).unwrap();
        assert!(s.fenced);
        assert_eq!(s.lac, Some(1));
        assert_eq!(s.last_entry, Some(2));
        // Ledger 2's fence for KEY came back from the journal.
        assert!(matches!(
            e.add_entry(2, 0, KEY, None, payload(2, 0, 10), false).await,
            Err(Error::Fenced { ledger: 2 })
        ));
        assert!(matches!(
            e.add_entry(1, 3, KEY, Some(2), payload(1, 3, 10), false)
                .await,
            Err(Error::Fenced { ledger: 1 })
        ));
        assert!(matches!(
            e.add_entry(1, 3, [1; 20], Some(2), payload(1, 3, 10), true)
                .await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        // Through a checkpoint (state now in the index, journal trimmed) the fence still holds.
        e.checkpoint().await.unwrap();
        e.close().await.unwrap();
    });
    let cfg3 = config(dir.path());
    run(move || async move {
        let e = Engine::open(cfg3).await.unwrap();
        assert!(e.ledger_state(1).unwrap().fenced);
        assert!(matches!(
            e.add_entry(1, 3, KEY, None, payload(1, 3, 10), false).await,
            Err(Error::Fenced { ledger: 1 })
        ));
        assert!(matches!(
            e.fence(1, [3; 20]).await,
            Err(Error::Unauthorized { ledger: 1 })
        ));
        assert_eq!(e.read_entry(1, Some(2)).await.unwrap(), payload(1, 2, 10));
        // Ledger 2's fence for KEY came back from the index, and binds at the first add:
        // a recovery add with KEY is taken, and the ledger is then fenced for readers too.
        assert!(matches!(
            e.add_entry(2, 0, KEY, None, payload(2, 0, 10), false).await,
            Err(Error::Fenced { ledger: 2 })
        ));
        e.add_entry(2, 0, KEY, None, payload(2, 0, 10), true)
            .await
            .unwrap();
        assert!(e.ledger_state(2).unwrap().fenced);
        e.close().await.unwrap();
    });
}
