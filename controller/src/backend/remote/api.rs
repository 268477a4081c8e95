//! [`ProviderApi`]: the one client of a provider's control plane, generic
//! over its [`Dialect`], what only that provider says differently: its
//! name, how the key is sent, the route that shows a key works, what to do
//! about a refusal, and how its listing of machines pages. What every
//! provider's client does the same lives here once: the REST client with
//! the key, a shorter retry budget for work that can wait, the check of
//! the key (`silo doctor`), a find by labels page by page, and the error
//! for a refusal.

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, StatusCode};

use super::config::{ProviderConfig, ProviderConfigError, Settings};
use super::rest::{Reply, Rest, RestError};
use crate::backend::labels::LABEL_SANDBOX_ID;

/// How long the check of the key may retry.
const CHECK_BUDGET: Duration = Duration::from_secs(3);

/// What to do about a refusal, by its status; empty for none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hints {
    /// For 401: the key.
    pub unauthorized: &'static str,
    /// For 403: what the key may do.
    pub forbidden: &'static str,
    /// For 404: the template named.
    pub not_found: &'static str,
    /// For 429: the quota or rate limit.
    pub too_many: &'static str,
}

impl Hints {
    /// The hint for `status`, as the end of a message (` (…)`).
    fn of(&self, status: u16) -> &'static str {
        match status {
            401 => self.unauthorized,
            403 => self.forbidden,
            404 => self.not_found,
            429 => self.too_many,
            _ => "",
        }
    }
}

/// One page of a provider's listing of machines.
#[derive(Debug, Default)]
pub struct Page {
    /// Each machine's provider id and labels (E2B's metadata).
    pub machines: Vec<(String, BTreeMap<String, String>)>,
    /// The cursor of the next page; `None` on the last.
    pub next: Option<String>,
}

/// What one provider's control plane says its own way. It is a value (not
/// only a type) so a provider can keep what it learns of its API in it
/// (E2B: which generation of its routes it serves), shared by the clones
/// of one backend's clients.
pub trait Dialect: Clone + Default + std::fmt::Debug {
    /// The provider as people know it, in messages ("E2B").
    const NAME: &'static str;
    /// A route that lists at most one machine: answered, it shows the key
    /// is accepted.
    const CHECK_ROUTE: &'static str;
    /// What to do about a refusal of the control plane.
    const HINTS: Hints;
    /// Most pages a find follows.
    const MAX_PAGES: usize;
    /// The error of the provider's operations.
    type Error: From<RestError> + From<ProviderConfigError>;

    /// The header that carries `key` on every request.
    fn auth_header(key: &str) -> (String, String);

    /// The route of the page after `cursor` (`None`: the first) of the
    /// machines carrying every label of `labels`.
    fn page_route(labels: &BTreeMap<String, String>, cursor: Option<&str>) -> String;

    /// The machines of a page's answer, and where the next page starts.
    fn read_page(reply: &Reply) -> Result<Page, RestError>;
}

/// A provider's control plane, with this home's key.
#[derive(Debug, Clone)]
pub struct ProviderApi<D> {
    rest: Rest,
    dialect: D,
}

impl<D: Dialect> ProviderApi<D> {
    /// A client for the control plane `config` names.
    pub fn new<S: Settings>(config: &ProviderConfig<S>) -> Result<Self, D::Error> {
        Self::speaking(config, D::default())
    }

    /// A client for the control plane `config` names, keeping what it
    /// learns of the API in `dialect` (shared with the other clients of one
    /// backend).
    pub fn speaking<S: Settings>(config: &ProviderConfig<S>, dialect: D) -> Result<Self, D::Error> {
        let key = config.api_key()?;
        let rest = Rest::new(
            format!("the {} API", D::NAME),
            &config.api_url,
            config.ca_pem.clone(),
            vec![D::auth_header(key)],
        )?;
        Ok(Self { rest, dialect })
    }

    /// The REST client, with the key.
    pub fn rest(&self) -> &Rest {
        &self.rest
    }

    /// What this client knows of the provider's API.
    pub fn dialect(&self) -> &D {
        &self.dialect
    }

    /// The same client, retrying for `budget` at most: for work that can
    /// wait for the next run (gc's sweep), so an unreachable API costs
    /// seconds, not the full retry budget.
    pub fn with_retry_budget(mut self, budget: Duration) -> Self {
        self.rest = self.rest.with_retry_budget(budget);
        self
    }

    /// Whether the key is accepted: one list call of one machine, retried
    /// for a few seconds at most.
    pub async fn check(&self) -> Result<(), D::Error> {
        let reply = self
            .rest
            .clone()
            .with_retry_budget(CHECK_BUDGET)
            .json(Method::GET, D::CHECK_ROUTE, None)
            .await?;
        match reply.status {
            StatusCode::OK => Ok(()),
            _ => Err(self.refused("list sandboxes", &reply).into()),
        }
    }

    /// Every machine whose labels include all of `labels`, page by page,
    /// each as its provider id and the silo sandbox id it is labelled with.
    pub async fn find(
        &self,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<(String, Option<String>)>, D::Error> {
        let mut found = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..D::MAX_PAGES {
            let route = D::page_route(labels, cursor.as_deref());
            let reply = self.rest.json(Method::GET, &route, None).await?;
            if reply.status != StatusCode::OK {
                return Err(self.refused("list sandboxes", &reply).into());
            }
            let page = D::read_page(&reply)?;
            found.extend(
                page.machines
                    .into_iter()
                    .map(|(id, mut labels)| (id, labels.remove(LABEL_SANDBOX_ID))),
            );
            cursor = page.next.filter(|next| !next.is_empty());
            if cursor.is_none() {
                break;
            }
        }
        Ok(found)
    }

    /// The error for an answer the control plane gave instead of doing
    /// `what`, with what to do about it when the status says.
    pub fn refused(&self, what: &str, reply: &Reply) -> RestError {
        RestError::Refused {
            who: D::NAME.to_owned(),
            what: what.to_owned(),
            status: reply.status.as_u16(),
            message: reply.message(),
            hint: D::HINTS.of(reply.status.as_u16()),
        }
    }
}
