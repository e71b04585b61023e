//! The `QUIRE_FAULT_POINTS` grammar (docs/fault-points.md).

/// A bookie request type a message fault selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// An add (normal or recovery add).
    Add,
    /// A plain read (no fence flag).
    Read,
    /// A read with the fence flag (recovery's reads), or a fence request.
    Fence,
    /// A LAC read or a LAC long poll.
    Lac,
}

/// What a message fault does to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Answer with this wire status (docs/protocol.md's status table) instead of running it.
    Fail(u16),
    /// Run it, answering this many milliseconds later.
    Delay(u64),
    /// Never answer it (the client's request timeout decides).
    Drop,
}

/// A per-message fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageFault {
    pub op: Op,
    pub action: Action,
    /// Only this ledger (any when `None`).
    pub ledger: Option<u64>,
    /// Only entries in this inclusive range (any when `None`; a request naming no entry, such
    /// as a LAC read or a read of the last entry, matches only when this is `None`).
    pub entries: Option<(u64, u64)>,
    /// Only the first `count` matching requests.
    pub count: Option<u64>,
}

impl MessageFault {
    /// Whether a request `op` on `ledger` (for `entry`) is selected.
    pub fn matches(&self, op: Op, ledger: u64, entry: Option<u64>) -> bool {
        self.op == op
            && self.ledger.is_none_or(|l| l == ledger)
            && match (self.entries, entry) {
                (None, _) => true,
                (Some((a, b)), Some(e)) => a <= e && e <= b,
                (Some(_), None) => false,
            }
    }
}

/// A named crash point.
#[derive(Debug, Clone, PartialEq)]
pub struct CrashPoint {
    pub point: String,
    /// For a progress point: abort once this fraction (0..=1) of the work is done.
    pub fraction: Option<f64>,
    /// Abort on this pass (1 = the first).
    pub nth: u64,
}

/// One armed fault.
#[derive(Debug, Clone, PartialEq)]
pub enum Fault {
    Crash(CrashPoint),
    Message(MessageFault),
}

/// Every fault of a `QUIRE_FAULT_POINTS` value, in order (the first match wins).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Spec {
    pub faults: Vec<Fault>,
}

/// Parses a `QUIRE_FAULT_POINTS` value: items separated by `;` (blank items ignored).
///
/// # Errors
/// A message naming the item that does not parse and why.
pub fn parse(text: &str) -> Result<Spec, String> {
    let mut faults = Vec::new();
    for item in text.split(';').map(str::trim).filter(|s| !s.is_empty()) {
        let f = parse_item(item).map_err(|why| format!("fault point {item:?}: {why}"))?;
        faults.push(f);
    }
    Ok(Spec { faults })
}

fn parse_item(item: &str) -> Result<Fault, String> {
    let (kind, rest) = item
        .split_once('=')
        .ok_or("expected crash=<point> or <op>=<action>")?;
    if kind == "crash" {
        return parse_crash(rest).map(Fault::Crash);
    }
    let op = match kind {
        "add" => Op::Add,
        "read" => Op::Read,
        "fence" => Op::Fence,
        "lac" => Op::Lac,
        other => {
            return Err(format!(
                "unknown kind {other:?} (crash, add, read, fence, lac)"
            ))
        }
    };
    let mut parts = rest.split(',');
    let action = parse_action(parts.next().unwrap_or(""))?;
    let mut m = MessageFault {
        op,
        action,
        ledger: None,
        entries: None,
        count: None,
    };
    for p in parts {
        let (k, v) = p
            .split_once('=')
            .ok_or(format!("expected key=value, got {p:?}"))?;
        match k {
            "ledger" => m.ledger = Some(num(v)?),
            "entry" => {
                let e = num(v)?;
                m.entries = Some((e, e));
            }
            "entries" => {
                let (a, b) = v.split_once('-').ok_or("entries=<first>-<last>")?;
                m.entries = Some((num(a)?, num(b)?));
            }
            "count" => m.count = Some(num(v)?),
            other => {
                return Err(format!(
                    "unknown key {other:?} (ledger, entry, entries, count)"
                ))
            }
        }
    }
    Ok(Fault::Message(m))
}

fn parse_action(a: &str) -> Result<Action, String> {
    if a == "drop" {
        return Ok(Action::Drop);
    }
    if let Some(code) = a.strip_prefix("fail:") {
        return code
            .parse()
            .map(Action::Fail)
            .map_err(|_| format!("bad status {code:?}"));
    }
    if let Some(ms) = a.strip_prefix("delay:") {
        return num(ms).map(Action::Delay);
    }
    Err(format!(
        "unknown action {a:?} (fail:<status>, delay:<ms>, drop)"
    ))
}

fn parse_crash(rest: &str) -> Result<CrashPoint, String> {
    let (rest, nth) = match rest.split_once('#') {
        Some((r, n)) => (r, num(n)?),
        None => (rest, 1),
    };
    if nth == 0 {
        return Err("#<nth> counts from 1".into());
    }
    let (point, fraction) = match rest.split_once('@') {
        Some((p, f)) => {
            let f: f64 = f.parse().map_err(|_| format!("bad fraction {f:?}"))?;
            if !(0.0..=1.0).contains(&f) {
                return Err(format!("fraction {f} not in 0..=1"));
            }
            (p, Some(f))
        }
        None => (rest, None),
    };
    if point.is_empty() {
        return Err("no point name".into());
    }
    Ok(CrashPoint {
        point: point.to_string(),
        fraction,
        nth,
    })
}

fn num(v: &str) -> Result<u64, String> {
    v.parse().map_err(|_| format!("bad number {v:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crash_and_message_items_parse() {
        let s = parse(
            "crash=engine.replay@0.1; read=fail:101,ledger=7,entry=3,count=2;lac=drop;crash=x#3",
        )
        .unwrap();
        assert_eq!(s.faults.len(), 4);
        assert_eq!(
            s.faults[0],
            Fault::Crash(CrashPoint {
                point: "engine.replay".into(),
                fraction: Some(0.1),
                nth: 1
            })
        );
        let Fault::Message(m) = &s.faults[1] else {
            panic!()
        };
        assert_eq!(m.action, Action::Fail(101));
        assert!(m.matches(Op::Read, 7, Some(3)));
        assert!(!m.matches(Op::Read, 7, Some(4)));
        assert!(!m.matches(Op::Read, 8, Some(3)));
        assert!(!m.matches(Op::Fence, 7, Some(3)));
        assert!(!m.matches(Op::Read, 7, None));
        let Fault::Message(l) = &s.faults[2] else {
            panic!()
        };
        assert!(l.matches(Op::Lac, 1, None));
        assert!(matches!(&s.faults[3], Fault::Crash(c) if c.nth == 3));
        let Fault::Message(r) = &parse("add=delay:50,entries=2-4").unwrap().faults[0] else {
            panic!()
        };
        assert!(r.matches(Op::Add, 9, Some(4)) && !r.matches(Op::Add, 9, Some(5)));
    }

    #[test]
    fn bad_items_are_refused_with_their_text() {
        for bad in [
            "crash",
            "crash=",
            "crash=a@2",
            "crash=a#0",
            "write=drop",
            "read=explode",
            "read=fail:x",
            "read=drop,ledger=a",
            "read=drop,entries=5",
            "read=drop,shard=1",
        ] {
            let e = parse(bad).unwrap_err();
            assert!(e.contains(bad.split(',').next().unwrap()), "{bad}: {e}");
        }
        assert_eq!(parse(" ; ").unwrap().faults.len(), 0);
    }
}
