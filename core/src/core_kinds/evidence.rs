//! The evidence a driver-observed trial's detail carries: lists of events,
//! kept under ~2 KB.

use falsify_observer::Event;

/// The most characters a list in a detail takes before "... and N more".
pub const MAX_LIST_CHARS: usize = 1500;

/// `items` joined with `; `, cut after [`MAX_LIST_CHARS`] with the count
/// of those left out.
pub fn listed(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    let mut out = String::new();
    for (i, item) in items.iter().enumerate() {
        if out.len() + item.len() > MAX_LIST_CHARS && i > 0 {
            out.push_str(&format!("; ... and {} more", items.len() - i));
            return out;
        }
        if i > 0 {
            out.push_str("; ");
        }
        out.push_str(item);
    }
    out
}

/// The label of the last marker before event `seq` (`step 3`,
/// `prepared`), or `before any marker`.
pub fn marker_before(events: &[Event], seq: u64) -> String {
    events
        .iter()
        .take_while(|e| e.seq < seq)
        .filter_map(|e| match &e.kind {
            falsify_observer::EventKind::Marker { label } => Some(label.clone()),
            _ => None,
        })
        .last()
        .unwrap_or_else(|| "before any marker".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_are_cut_with_the_count_left_out() {
        assert_eq!(listed(["a".to_string(), "b".to_string()]), "a; b");
        let long = listed((0..1000).map(|i| format!("item {i}")));
        assert!(long.len() < MAX_LIST_CHARS + 40, "{}", long.len());
        assert!(long.ends_with("more"), "{long}");
        assert_eq!(listed(Vec::new()), "");
    }
}
