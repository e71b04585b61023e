//! [`ProxyClient`]'s subscription calls (opcodes 0x0C to 0x0F, DistributedLog's
//! `SubscriptionsStore`). Any proxy answers them from the metadata store, so they go to the
//! home proxy without redirects.

use std::time::Duration;

use super::{unexpected, ProxyClient};
use crate::dlsn::Dlsn;
use crate::error::Result;
use crate::protocol::{Request, Response};
use crate::subscription::SubscriptionInfo;

impl ProxyClient {
    /// Moves subscription `name` of `stream` forward to `position` (the first record not yet
    /// processed), creating it if needed, and returns the subscription in force: a `position`
    /// at or before the committed one changes nothing (DistributedLog
    /// `advanceCommitPosition`).
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest` (a bad name, or a position past the next
    /// segment), `RequestDenied` (no read right), `Metadata`; `Io`.
    pub async fn commit_subscription(
        &self,
        stream: &str,
        name: &str,
        position: Dlsn,
    ) -> Result<SubscriptionInfo> {
        let req = Request::CommitSubscription {
            stream: stream.to_string(),
            name: name.to_string(),
            position,
        };
        self.subscription_call(&req).await
    }

    /// Subscription `name` of `stream` with its lag; `committed: None` when nothing was
    /// committed under that name (DistributedLog `getLastCommitPosition`).
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest`, `RequestDenied`, `Metadata`; `Io`.
    pub async fn subscription(&self, stream: &str, name: &str) -> Result<SubscriptionInfo> {
        let req = Request::GetSubscription {
            stream: stream.to_string(),
            name: name.to_string(),
        };
        self.subscription_call(&req).await
    }

    /// Every subscription of `stream`, sorted by name, each with its lag.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `RequestDenied`, `Metadata`; `Io`.
    pub async fn list_subscriptions(&self, stream: &str) -> Result<Vec<SubscriptionInfo>> {
        let req = Request::ListSubscriptions {
            stream: stream.to_string(),
        };
        match self.router.home().await?.call(&req, Duration::ZERO).await? {
            Response::ListSubscriptions { subscriptions } => Ok(subscriptions),
            other => Err(unexpected(&other)),
        }
    }

    /// Deletes subscription `name` of `stream`; `false` when there was none
    /// (DistributedLog `deleteSubscriber`). Needs the admin right.
    ///
    /// # Errors
    /// `Remote` with `NoSuchStream`, `BadRequest`, `RequestDenied`, `Metadata`; `Io`.
    pub async fn delete_subscription(&self, stream: &str, name: &str) -> Result<bool> {
        let req = Request::DeleteSubscription {
            stream: stream.to_string(),
            name: name.to_string(),
        };
        match self.router.home().await?.call(&req, Duration::ZERO).await? {
            Response::DeleteSubscription { existed } => Ok(existed),
            other => Err(unexpected(&other)),
        }
    }

    async fn subscription_call(&self, req: &Request) -> Result<SubscriptionInfo> {
        match self.router.home().await?.call(req, Duration::ZERO).await? {
            Response::Subscription { info } => Ok(info),
            other => Err(unexpected(&other)),
        }
    }
}
