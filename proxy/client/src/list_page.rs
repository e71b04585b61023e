//! Paging of `LIST_STREAMS` (opcode `0x03` with flag [`crate::protocol::FLAG_LIST_PAGED`]):
//! the page token and the choice of one page out of the sorted stream names.
//!
//! A page token is opaque to clients. This version writes `1:` followed by the lowercase hex of
//! the last name of the page; the next page starts at the first name above it, so a token
//! stays valid when streams are created or deleted between pages (names created behind the
//! token are not seen, as in ZooKeeper's `getChildren` paging by name). The empty token asks
//! for the first page, and the answer's empty token marks the last page.

/// Most names one page holds, whatever the request asks (the proxy's bound: 1,000 names of at
/// most 1,028 bytes on the wire stay far below the 5 MiB frame limit).
pub const LIST_PAGE_SIZE_MAX: u32 = 1_000;

/// Longest page token on the wire, in bytes: `1:` and the hex of a 1,024-byte name, rounded up.
pub const PAGE_TOKEN_BYTES_MAX: usize = 4_096;

/// The names one page answers: the page size actually used for a request asking for
/// `requested` (0: the maximum).
pub fn page_size(requested: u32) -> usize {
    if requested == 0 {
        LIST_PAGE_SIZE_MAX as usize
    } else {
        requested.min(LIST_PAGE_SIZE_MAX) as usize
    }
}

/// The token that continues after `last_name`.
pub fn token_after(last_name: &str) -> String {
    let mut t = String::with_capacity(2 + 2 * last_name.len());
    t.push_str("1:");
    for b in last_name.bytes() {
        t.push_str(&format!("{b:02x}"));
    }
    t
}

/// The last name of the page before `token`; `None` for the empty token (the first page).
///
/// # Errors
/// A message saying why the token is not one this module wrote (the proxy answers
/// `BAD_REQUEST`).
pub fn name_before(token: &str) -> Result<Option<String>, String> {
    if token.is_empty() {
        return Ok(None);
    }
    let hex = token.strip_prefix("1:").ok_or_else(|| {
        format!("page token {token:?} is not one a proxy wrote (no version 1: prefix)")
    })?;
    if hex.len() % 2 != 0 || hex.is_empty() {
        return Err(format!(
            "page token {token:?} is malformed (odd or empty name)"
        ));
    }
    let bytes = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16))
        .collect::<Result<Vec<u8>, _>>()
        .map_err(|_| format!("page token {token:?} is malformed (not hex)"))?;
    String::from_utf8(bytes)
        .map(Some)
        .map_err(|_| format!("page token {token:?} is malformed (not a UTF-8 name)"))
}

/// One page of `sorted` (every stream name, ascending): the names starting with `prefix` and
/// above the token's name, at most [`page_size`]`(requested)` of them, and the token of the
/// next page (empty when this page is the last). Cost: a binary search and the page's names.
///
/// # Errors
/// A bad token ([`name_before`]), or one whose name does not start with `prefix` (a token of
/// a listing with another prefix).
pub fn select(
    sorted: &[String],
    prefix: &str,
    token: &str,
    requested: u32,
) -> Result<(Vec<String>, String), String> {
    let after = name_before(token)?;
    if let Some(a) = &after {
        if !a.starts_with(prefix) {
            return Err(format!(
                "page token {token:?} belongs to a listing without prefix {prefix:?}"
            ));
        }
    }
    let start = match &after {
        Some(a) => sorted.partition_point(|n| n.as_str() <= a.as_str()),
        None => sorted.partition_point(|n| n.as_str() < prefix),
    };
    let size = page_size(requested);
    let mut matching = sorted[start..].iter().take_while(|n| n.starts_with(prefix));
    let page: Vec<String> = matching.by_ref().take(size).cloned().collect();
    let next = match (page.last(), matching.next()) {
        (Some(last), Some(_)) => token_after(last),
        _ => String::new(),
    };
    Ok((page, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn pages_follow_each_other_to_an_empty_token() {
        // Goal: following tokens yields every name once, in order, and the last page's token
        // is empty; method: 7 names in pages of 3.
        let all = names(&["a", "b", "c", "d", "e", "f", "g"]);
        let (p1, t1) = select(&all, "", "", 3).unwrap();
        assert_eq!(p1, names(&["a", "b", "c"]));
        let (p2, t2) = select(&all, "", &t1, 3).unwrap();
        assert_eq!(p2, names(&["d", "e", "f"]));
        let (p3, t3) = select(&all, "", &t2, 3).unwrap();
        assert_eq!(p3, names(&["g"]));
        assert_eq!(t3, "");
    }

    #[test]
    fn a_full_last_page_ends_with_an_empty_token() {
        // Goal: no empty extra page when the names fill the last page exactly.
        let all = names(&["a", "b", "c", "d"]);
        let (_, t1) = select(&all, "", "", 2).unwrap();
        let (p2, t2) = select(&all, "", &t1, 2).unwrap();
        assert_eq!(p2, names(&["c", "d"]));
        assert_eq!(t2, "");
    }

    #[test]
    fn prefix_limits_the_names() {
        // Goal: only names under the prefix, paged, nothing after them.
        let all = names(&["app/a", "app/b", "app/c", "apq", "logs/x", "ap"]);
        let mut sorted = all.clone();
        sorted.sort();
        let (p1, t1) = select(&sorted, "app/", "", 2).unwrap();
        assert_eq!(p1, names(&["app/a", "app/b"]));
        let (p2, t2) = select(&sorted, "app/", &t1, 2).unwrap();
        assert_eq!(p2, names(&["app/c"]));
        assert_eq!(t2, "");
        let (none, t) = select(&sorted, "zzz", "", 2).unwrap();
        assert!(none.is_empty() && t.is_empty());
    }

    #[test]
    fn tokens_survive_changes_between_pages() {
        // Goal: a token continues after its name even when that name was deleted.
        let (_, t1) = select(&names(&["a", "b", "c"]), "", "", 2).unwrap();
        let (p2, _) = select(&names(&["a", "c", "d"]), "", &t1, 2).unwrap();
        assert_eq!(p2, names(&["c", "d"]));
    }

    #[test]
    fn bad_tokens_are_refused() {
        // Goal: tokens not written by this module, and tokens of another prefix, are errors.
        let all = names(&["a", "b"]);
        for bad in ["x", "1:", "1:6", "1:zz", "2:61", "1:ff"] {
            assert!(select(&all, "", bad, 1).is_err(), "{bad}");
        }
        let t = token_after("b");
        assert!(select(&all, "a", &t, 1).is_err());
    }

    #[test]
    fn page_size_is_bounded() {
        // Goal: 0 asks for the maximum, and no request gets more than it.
        assert_eq!(page_size(0), 1_000);
        assert_eq!(page_size(7), 7);
        assert_eq!(page_size(u32::MAX), 1_000);
        let all: Vec<String> = (0..2_500).map(|i| format!("s{i:05}")).collect();
        let (p, t) = select(&all, "", "", u32::MAX).unwrap();
        assert_eq!(p.len(), 1_000);
        assert_eq!(name_before(&t).unwrap().as_deref(), Some("s00999"));
    }
}
