//! `quire stream subs STREAM [--delete NAME]`: a stream's subscriptions (DistributedLog's
//! `SubscriptionsStore`) with their lag, or the deletion of one.

use anyhow::{Context, Result};
use quire_client::SubscriptionInfo;

use crate::stream::StreamSubsArgs;

/// Runs `quire stream subs`.
///
/// # Errors
/// The proxy's answer, in one line.
pub async fn run(a: StreamSubsArgs) -> Result<()> {
    let client = super::connect(&a.proxy).await?;
    if let Some(name) = &a.delete {
        let existed = client
            .delete_subscription(&a.stream, name)
            .await
            .with_context(|| {
                format!(
                    "cannot delete subscription {name:?} of stream {:?}",
                    a.stream
                )
            })?;
        match (a.output.json, existed) {
            (true, _) => println!(
                "{}",
                serde_json::json!({ "stream": a.stream, "subscription": name, "deleted": existed })
            ),
            (false, true) => println!("subscription {name} of stream {} deleted", a.stream),
            (false, false) => println!(
                "stream {} has no subscription {name}; nothing deleted",
                a.stream
            ),
        }
        return Ok(());
    }
    let subs = client
        .list_subscriptions(&a.stream)
        .await
        .with_context(|| format!("cannot list the subscriptions of stream {:?}", a.stream))?;
    if a.output.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&subs.iter().map(json).collect::<Vec<_>>())?
        );
    } else {
        print!("{}", table(&a.stream, &subs));
    }
    Ok(())
}

fn json(s: &SubscriptionInfo) -> serde_json::Value {
    serde_json::json!({
        "name": s.name,
        "committed": s.committed.map(|d| d.to_string()),
        "commit_time": s.commit_time_ms.map(super::position::format_rfc3339_ms),
        "lag_records": s.lag_records,
        "lag_bytes": s.lag_bytes,
    })
}

fn table(stream: &str, subs: &[SubscriptionInfo]) -> String {
    if subs.is_empty() {
        return format!("stream {stream} has no subscriptions\n");
    }
    let mut out = format!(
        "{:<24} {:<20} {:>12} {:>14}  committed at\n",
        "subscription", "resumes at", "lag records", "lag bytes"
    );
    for s in subs {
        out.push_str(&format!(
            "{:<24} {:<20} {:>12} {:>14}  {}\n",
            s.name,
            s.committed.map_or("-".to_string(), |d| d.to_string()),
            s.lag_records,
            s.lag_bytes,
            s.commit_time_ms
                .map_or("-".to_string(), super::position::format_rfc3339_ms)
        ));
    }
    out
}
