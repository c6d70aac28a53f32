//! OAuth 2.1 resource server: whether an access token presented to `serve` was issued by the
//! configured authorization server for this server, and whose it is. The MCP authorization spec
//! makes the bridge a resource server: it never sees a password or runs a login, it checks a
//! JWT's signature against the issuer's published keys and its `iss`, `aud`, `exp` (and `nbf`),
//! and takes the identity from `sub`.
//!
//! **Knows** `config` only (and the HTTP client): the HTTP layer asks [`Verifier::verify`] and
//! maps its [`TokenError`] to a 401 with `WWW-Authenticate`.
//!
//! The issuer's metadata is found as the MCP spec says (RFC 8414's
//! `/.well-known/oauth-authorization-server`, then OpenID Connect Discovery), and must name the
//! configured issuer exactly. Its key set (JWKS) is cached; a token naming a key the cache does
//! not have makes one refetch, at most every [`MIN_REFRESH`], so tokens with made-up key ids
//! cannot make the bridge hammer the issuer; the set is also refetched once it is
//! [`MAX_KEY_AGE`] old. Every fetch is bounded in time and bytes. Symmetric algorithms (`HS*`)
//! and `none` are never accepted: a key set holds public keys only.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use crate::config::OAuthConfig;
use crate::error::{Hint, Hinted};

/// A refetch for an unknown key id waits at least this long after the last fetch.
pub const MIN_REFRESH: Duration = Duration::from_secs(30);
/// Keys older than this are refetched at the next token (issuers rotate keys).
pub const MAX_KEY_AGE: Duration = Duration::from_secs(3600);
/// Longest answer read from the issuer (metadata or key set).
const MAX_DOCUMENT: usize = 1 << 20;
/// Longest token looked at; a longer one is refused unread.
pub const MAX_TOKEN: usize = 16 << 10;
/// Time for one request to the issuer.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
/// Clock skew allowed on `exp` and `nbf`.
const LEEWAY_SECS: u64 = 30;

/// Why the issuer could not be used (at start, or when its keys are refetched).
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    #[error("no authorization server metadata found for issuer {issuer} (tried {tried})")]
    NoMetadata { issuer: String, tried: String },
    #[error("the metadata at {url} names issuer {found:?}, not the configured {issuer:?}")]
    IssuerMismatch {
        issuer: String,
        url: String,
        found: String,
    },
    #[error("the metadata at {url} has no jwks_uri")]
    NoJwksUri { url: String },
    #[error("cannot read {url}: {reason}")]
    Fetch { url: String, reason: String },
}

impl Hinted for OAuthError {
    /// What to do next.
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(match self {
            OAuthError::NoMetadata { .. } | OAuthError::Fetch { .. } => {
                "check that oauth.issuer is the issuer's URL as its tokens' iss claim names it, and that this host can reach it"
            }
            OAuthError::IssuerMismatch { .. } => {
                "set oauth.issuer to the issuer the metadata names (the iss claim of its tokens), character for character"
            }
            OAuthError::NoJwksUri { .. } => {
                "the authorization server must publish its signing keys (jwks_uri) for tokens to be checked here"
            }
        }))
    }
}

/// Why a token was refused. Shown to the client (as `error_description`), so it names the
/// failed check but never echoes the token.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TokenError {
    #[error("the access token is not a signed JWT: {0}")]
    Malformed(String),
    #[error("the access token is longer than {MAX_TOKEN} bytes")]
    TooLong,
    #[error("the access token is signed with a key the issuer does not publish ({0})")]
    UnknownKey(String),
    #[error("the access token's algorithm {0} is not accepted (asymmetric signatures only)")]
    Algorithm(String),
    #[error("the access token's signature does not verify")]
    BadSignature,
    #[error("the access token has expired")]
    Expired,
    #[error("the access token is not valid yet (nbf)")]
    NotYetValid,
    #[error("the access token was issued for another audience, not {0}")]
    WrongAudience(String),
    #[error("the access token was issued by another issuer, not {0}")]
    WrongIssuer(String),
    #[error("the access token lacks the {0} claim")]
    MissingClaim(String),
    #[error("the issuer's keys cannot be read now: {0}")]
    KeysUnavailable(String),
}

/// Whose a verified token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The token's `sub`.
    pub subject: String,
}

#[derive(Deserialize)]
struct Metadata {
    issuer: String,
    jwks_uri: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
}

struct Keys {
    set: Arc<JwkSet>,
    fetched: Instant,
}

/// The configured issuer's tokens, checked. Cheap to share (`Arc` it); `verify` takes `&self`.
pub struct Verifier {
    issuer: String,
    audience: String,
    jwks_uri: String,
    http: reqwest::Client,
    keys: RwLock<Keys>,
    /// Held while the keys are refetched, so concurrent requests wait for one fetch.
    refresh: tokio::sync::Mutex<()>,
    leeway: u64,
}

impl Verifier {
    /// Find the issuer's metadata and read its keys: the bridge refuses to start without them
    /// (an unreachable issuer would otherwise refuse everyone later, less clearly).
    pub async fn discover(config: &OAuthConfig) -> Result<Verifier, OAuthError> {
        let issuer = config.issuer.clone().unwrap_or_default();
        let audience = config.audience.clone().unwrap_or_default();
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| OAuthError::Fetch {
                url: issuer.clone(),
                reason: e.to_string(),
            })?;
        let mut tried = Vec::new();
        let mut found = None;
        for url in metadata_urls(&issuer) {
            match fetch_json::<Metadata>(&http, &url).await {
                Ok(m) => {
                    found = Some((url, m));
                    break;
                }
                Err(reason) => {
                    tracing::debug!(%url, %reason, "no authorization server metadata here");
                    tried.push(url);
                }
            }
        }
        let Some((url, meta)) = found else {
            return Err(OAuthError::NoMetadata {
                issuer,
                tried: tried.join(", "),
            });
        };
        if meta.issuer.trim_end_matches('/') != issuer.trim_end_matches('/') {
            return Err(OAuthError::IssuerMismatch {
                issuer,
                url,
                found: meta.issuer,
            });
        }
        let jwks_uri = meta.jwks_uri.ok_or(OAuthError::NoJwksUri { url })?;
        let set = fetch_json::<JwkSet>(&http, &jwks_uri)
            .await
            .map_err(|reason| OAuthError::Fetch {
                url: jwks_uri.clone(),
                reason,
            })?;
        tracing::info!(%issuer, keys = set.keys.len(), "OAuth issuer's keys read");
        Ok(Verifier {
            issuer,
            audience,
            jwks_uri,
            http,
            keys: RwLock::new(Keys {
                set: Arc::new(set),
                fetched: Instant::now(),
            }),
            refresh: tokio::sync::Mutex::new(()),
            leeway: LEEWAY_SECS,
        })
    }

    /// Clock skew allowed on `exp` and `nbf` instead of the default 30 s (0 in the tests,
    /// which check expiry without waiting for it).
    pub fn with_leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway.as_secs();
        self
    }

    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The identity of `token` if the issuer signed it for this audience and it is in date.
    pub async fn verify(&self, token: &str) -> Result<Identity, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::TooLong);
        }
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if !asymmetric(header.alg) {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let kid = header.kid.clone();
        let jwk = match self.key(kid.as_deref(), false) {
            Some(k) => k,
            None => {
                self.refetch().await;
                self.key(kid.as_deref(), true)
                    .ok_or_else(|| TokenError::UnknownKey(kid.unwrap_or_else(|| "no kid".into())))?
            }
        };
        if let Some(alg) = jwk.common.key_algorithm
            && format!("{alg:?}") != format!("{:?}", header.alg)
        {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| TokenError::UnknownKey(e.to_string()))?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&self.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(|e| self.refusal(e))?;
        if data.claims.sub.is_empty() {
            return Err(TokenError::MissingClaim("sub".into()));
        }
        Ok(Identity {
            subject: data.claims.sub,
        })
    }

    fn refusal(&self, e: jsonwebtoken::errors::Error) -> TokenError {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidSignature => TokenError::BadSignature,
            K::ExpiredSignature => TokenError::Expired,
            K::ImmatureSignature => TokenError::NotYetValid,
            K::InvalidAudience => TokenError::WrongAudience(self.audience.clone()),
            K::InvalidIssuer => TokenError::WrongIssuer(self.issuer.clone()),
            K::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
            K::InvalidAlgorithm | K::InvalidAlgorithmName | K::UnsupportedAlgorithm => {
                TokenError::Algorithm(e.to_string())
            }
            _ => TokenError::Malformed(e.to_string()),
        }
    }

    /// The key `kid` names (the only key, when the token names none and there is one). Keys
    /// past their age make the caller refetch unless `stale_ok`.
    fn key(&self, kid: Option<&str>, stale_ok: bool) -> Option<Jwk> {
        let keys = self.keys.read().unwrap();
        if !stale_ok && keys.fetched.elapsed() > MAX_KEY_AGE {
            return None;
        }
        match kid {
            Some(kid) => keys.set.find(kid).cloned(),
            None if keys.set.keys.len() == 1 => keys.set.keys.first().cloned(),
            None => None,
        }
    }

    /// Read the key set again, unless it was read less than [`MIN_REFRESH`] ago; a failure
    /// keeps the keys there are (logged).
    async fn refetch(&self) {
        let _one = self.refresh.lock().await;
        if self.keys.read().unwrap().fetched.elapsed() < MIN_REFRESH {
            return;
        }
        match fetch_json::<JwkSet>(&self.http, &self.jwks_uri).await {
            Ok(set) => {
                *self.keys.write().unwrap() = Keys {
                    set: Arc::new(set),
                    fetched: Instant::now(),
                };
            }
            Err(reason) => {
                tracing::warn!(url = %self.jwks_uri, %reason, "cannot refetch the OAuth issuer's keys; keeping the ones read before");
                // Wait MIN_REFRESH before the next try as after a success.
                self.keys.write().unwrap().fetched = Instant::now();
            }
        }
    }
}

/// Where the metadata of `issuer` may be, in the order of the MCP authorization spec: RFC 8414
/// with the path inserted after the well-known prefix, OpenID Connect with the path inserted,
/// and OpenID Connect appended to the path.
fn metadata_urls(issuer: &str) -> Vec<String> {
    let Ok(url) = url::Url::parse(issuer) else {
        return Vec::new();
    };
    let origin = url.origin().ascii_serialization();
    let path = url.path().trim_end_matches('/');
    let mut urls = vec![format!(
        "{origin}/.well-known/oauth-authorization-server{path}"
    )];
    if path.is_empty() {
        urls.push(format!("{origin}/.well-known/openid-configuration"));
    } else {
        urls.push(format!("{origin}/.well-known/openid-configuration{path}"));
        urls.push(format!("{origin}{path}/.well-known/openid-configuration"));
    }
    urls
}

/// GET `url` as JSON, at most [`MAX_DOCUMENT`] bytes.
async fn fetch_json<T: serde::de::DeserializeOwned>(
    http: &reqwest::Client,
    url: &str,
) -> Result<T, String> {
    let mut resp = http
        .get(url)
        .header(reqwest::header::ACCEPT, "application/json")
        .send()
        .await
        .map_err(|e| e.to_string())?;
    if !resp.status().is_success() {
        return Err(format!("HTTP {}", resp.status()));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_DOCUMENT as u64)
    {
        return Err(format!("larger than {} KiB", MAX_DOCUMENT >> 10));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
        if body.len() + chunk.len() > MAX_DOCUMENT {
            return Err(format!("larger than {} KiB", MAX_DOCUMENT >> 10));
        }
        body.extend_from_slice(&chunk);
    }
    serde_json::from_slice(&body).map_err(|e| format!("not the expected JSON: {e}"))
}

/// Signature algorithms of public keys; `HS*` would take a published key as a shared secret.
fn asymmetric(alg: Algorithm) -> bool {
    !matches!(alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_is_looked_up_where_the_spec_says() {
        assert_eq!(
            metadata_urls("https://id.example"),
            [
                "https://id.example/.well-known/oauth-authorization-server",
                "https://id.example/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            metadata_urls("https://id.example/realms/team/"),
            [
                "https://id.example/.well-known/oauth-authorization-server/realms/team",
                "https://id.example/.well-known/openid-configuration/realms/team",
                "https://id.example/realms/team/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn only_asymmetric_algorithms_are_taken() {
        assert!(!asymmetric(Algorithm::HS256));
        assert!(asymmetric(Algorithm::RS256));
        assert!(asymmetric(Algorithm::ES256));
        assert!(asymmetric(Algorithm::EdDSA));
    }
}
