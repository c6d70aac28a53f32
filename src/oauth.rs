//! OAuth 2.1 resource server: whether an access token presented to `serve` was issued by one of
//! the configured authorization servers for this server, and whose it is. The MCP authorization
//! spec makes the bridge a resource server: it never sees a password or runs a login (so the
//! authorization response, and RFC 9207's `iss` in it, are the client's to check). It takes the
//! token's `iss`, which must be one of the configured issuers character for character, checks
//! the signature against that issuer's keys only, then `aud`, `exp` (and `nbf`), and takes the
//! identity from `sub`, keyed by issuer: `sub` for `oauth.issuer` (as before several issuers
//! could be configured), `sub@issuer` for each of `oauth.other_issuers`.
//!
//! A token's client (`client_id`, else `azp`) is not checked: it may be a Client ID Metadata
//! Document URL, which the authorization server resolved and vouched for when it issued the
//! token; the spec gives trust policies for such clients to authorization servers, not to the
//! resource server.
//!
//! **Knows** `config` only (and the HTTP client): the HTTP layer asks [`Verifier::verify`] and
//! maps its [`TokenError`] to a 401 with `WWW-Authenticate`.
//!
//! Each issuer's metadata is found as the MCP spec says (RFC 8414's
//! `/.well-known/oauth-authorization-server`, then OpenID Connect Discovery), and must name the
//! configured issuer identically (no trailing-slash or case folding). Its key set (JWKS) is cached; a token naming a key the cache does
//! not have makes one refetch, at most every [`MIN_REFRESH`], so tokens with made-up key ids
//! cannot make the bridge hammer the issuer; the set is also refetched once it is
//! [`MAX_KEY_AGE`] old. Every fetch is bounded in time and bytes. Symmetric algorithms (`HS*`)
//! and `none` are never accepted: a key set holds public keys only.
//!
//! A JWT typed as something other than an access token (its header's `typ`: a DPoP proof
//! `dpop+jwt`, a logout token, a security event, ...) is refused before any key is looked at,
//! even if the issuer signed it for this audience (RFC 9068 section 4, RFC 8725 section 3.11).
//! `at+jwt` (RFC 9068) is what such a token should say; `JWT` and no `typ` are accepted too,
//! since many authorization servers (Keycloak, Entra ID) type their access tokens so.

use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use bridge_core::config::OAuthConfig;
use bridge_core::error::{Hint, Hinted};

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

/// Why an issuer could not be used (at start, or when its keys are refetched).
#[derive(Debug, thiserror::Error)]
pub enum OAuthError {
    /// None of the issuer's well-known metadata URLs (RFC 8414, then OpenID Connect Discovery)
    /// answered with metadata.
    #[error("no authorization server metadata found for issuer {issuer} (tried {tried})")]
    NoMetadata {
        /// The issuer, as configured.
        issuer: String,
        /// The URLs tried, comma-separated.
        tried: String,
    },
    /// The metadata found names another issuer than the configured one (they must be
    /// identical, to the character).
    #[error(
        "the metadata at {url} names issuer {found:?}, not the configured {issuer:?} (they must be identical)"
    )]
    IssuerMismatch {
        /// The issuer, as configured.
        issuer: String,
        /// Where the metadata was found.
        url: String,
        /// The issuer the metadata names.
        found: String,
    },
    /// The metadata has no `jwks_uri`, so tokens' signatures cannot be checked.
    #[error("the metadata at {url} has no jwks_uri")]
    NoJwksUri {
        /// Where the metadata was found.
        url: String,
    },
    /// The issuer's key set (`jwks_uri`) could not be fetched or parsed (or no HTTP client
    /// could be made, then `url` is the issuer).
    #[error("cannot read {url}: {reason}")]
    Fetch {
        /// The key set's URL.
        url: String,
        /// What went wrong.
        reason: String,
    },
}

impl Hinted for OAuthError {
    /// What to do next.
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(match self {
            OAuthError::NoMetadata { .. } | OAuthError::Fetch { .. } => {
                "check that oauth.issuer (or the entry of oauth.other_issuers) is the issuer's URL as its tokens' iss claim names it, and that this host can reach it"
            }
            OAuthError::IssuerMismatch { .. } => {
                "set oauth.issuer (or the entry of oauth.other_issuers) to the issuer the metadata names (the iss claim of its tokens), character for character"
            }
            OAuthError::NoJwksUri { .. } => {
                "the authorization server must publish its signing keys (jwks_uri) for tokens to be checked here"
            }
        }))
    }
}

/// Why a token was refused, in the order the checks run. Shown to the client (as
/// `error_description`, with its hint), so it names the failed check but never echoes the
/// token.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TokenError {
    /// The token does not decode as a JWT (header, payload, an `iss` that is not a string);
    /// the field says what did not.
    #[error("the access token is not a signed JWT: {0}")]
    Malformed(String),
    /// The token is longer than [`MAX_TOKEN`] bytes; it is not read further.
    #[error("the access token is longer than {MAX_TOKEN} bytes")]
    TooLong,
    /// The token is signed with a symmetric or unknown algorithm, or one its key is not for;
    /// the field names it.
    #[error("the access token's algorithm {0} is not accepted (asymmetric signatures only)")]
    Algorithm(String),
    /// The header's `typ` names another kind of JWT than an access token.
    #[error("the JWT is typed {0:?}, not as an access token (at+jwt)")]
    NotAnAccessToken(String),
    /// A claim the checks need (`iss`, `exp`, `aud`, `sub`) is absent or empty; the field
    /// names it.
    #[error("the access token lacks the {0} claim")]
    MissingClaim(String),
    /// The `iss` claim is none of the configured issuers (compared as strings, unnormalised).
    #[error("the access token's issuer {found:?} is not one this server trusts ({trusted})")]
    UntrustedIssuer {
        /// The token's `iss`.
        found: String,
        /// The configured issuers, comma-separated.
        trusted: String,
    },
    /// Signed with a key another configured issuer publishes, not the one `iss` names.
    #[error(
        "the access token claims issuer {claimed} but is signed with key {kid:?} of issuer {signer}"
    )]
    KeyOfAnotherIssuer {
        /// The issuer the token's `iss` names.
        claimed: String,
        /// The issuer whose key it is.
        signer: String,
        /// The key's id.
        kid: String,
    },
    /// The key the token names is not among its issuer's keys, even after they were fetched
    /// again, or cannot be used.
    #[error("the access token is signed with a key issuer {issuer} does not publish ({kid})")]
    UnknownKey {
        /// The issuer the token's `iss` names.
        issuer: String,
        /// The key's id (`no kid` when the token names none), or why the key cannot be used.
        kid: String,
    },
    /// The signature does not verify with the key; the field is the issuer.
    #[error("the access token's signature does not verify with the keys of issuer {0}")]
    BadSignature(String),
    /// `exp` has passed (beyond the clock skew allowed).
    #[error("the access token has expired")]
    Expired,
    /// `nbf` is still to come (beyond the clock skew allowed).
    #[error("the access token is not valid yet (nbf)")]
    NotYetValid,
    /// `aud` does not name this server; the field is the audience it expects.
    #[error("the access token was issued for another audience, not {0}")]
    WrongAudience(String),
    /// The `iss` of the verified claims is not the issuer whose key signed them; the field is
    /// that issuer.
    #[error("the access token was issued by another issuer, not {0}")]
    WrongIssuer(String),
    /// A `sub` of `oauth.issuer` shaped like the identity of another issuer's user.
    #[error("the access token's sub ends in @{other}, the form of identities of issuer {other}")]
    SubjectOfAnotherIssuer {
        /// The other issuer.
        other: String,
    },
    /// The issuer's keys could not be read when the token needed them.
    #[error("the keys of issuer {issuer} cannot be read now: {reason}")]
    KeysUnavailable {
        /// The issuer.
        issuer: String,
        /// What went wrong.
        reason: String,
    },
}

impl Hinted for TokenError {
    /// What the client (or the operator reading the log) can do about it.
    fn hint(&self) -> Option<Hint> {
        Some(Hint::clause(match self {
            TokenError::Malformed(_) | TokenError::TooLong | TokenError::MissingClaim(_) => {
                "send an access token (a JWT) of one of the authorization_servers of this server's protected-resource metadata".into()
            }
            TokenError::Algorithm(_) => {
                "the authorization server must sign access tokens with an asymmetric key (RS*, PS*, ES*, EdDSA)".into()
            }
            TokenError::NotAnAccessToken(_) => {
                "send the access token the authorization server issued for this server (typ at+jwt, RFC 9068), not an ID token, DPoP proof or other JWT".into()
            }
            TokenError::UntrustedIssuer { found, .. } => format!(
                "get a token from one of the authorization_servers of this server's protected-resource metadata; an operator who trusts {found} adds it to oauth.other_issuers"
            ),
            TokenError::KeyOfAnotherIssuer { signer, .. } => format!(
                "a token is checked with the keys of the issuer its iss names only; use a token of {signer} as {signer} issued it"
            ),
            TokenError::UnknownKey { issuer, .. } => format!(
                "get a new token from {issuer}; if it rotated its keys, the bridge reads them again at most every {}s",
                MIN_REFRESH.as_secs()
            ),
            TokenError::BadSignature(_) => {
                "the token was altered after it was signed; get a new one".into()
            }
            TokenError::Expired | TokenError::NotYetValid => {
                "get a new token (and check that the clocks of this host and the authorization server agree)".into()
            }
            TokenError::WrongAudience(aud) => format!(
                "ask for a token with resource={aud} (RFC 8707), or set oauth.audience to the aud the authorization server puts in its tokens"
            ),
            TokenError::WrongIssuer(_) => {
                "get a token from one of the authorization_servers of this server's protected-resource metadata".into()
            }
            TokenError::SubjectOfAnotherIssuer { other } => format!(
                "the authorization server of oauth.issuer must not issue subjects ending in @{other}; remove {other} from oauth.other_issuers to accept them"
            ),
            TokenError::KeysUnavailable { issuer, .. } => {
                format!("check that this host can reach {issuer}; retry later")
            }
        }))
    }
}

/// Whose a verified token is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The issuer that signed the token (its `iss`, one of the configured issuers).
    pub issuer: String,
    /// The token's `sub`.
    pub subject: String,
    /// The token's client (`client_id`, else `azp`), when it names one: a Client ID Metadata
    /// Document's https URL, or a registered client's id.
    pub client: Option<String>,
    /// The bridge's identity of the token's user: `sub` for `oauth.issuer`, `sub@issuer` for
    /// the others, so one `sub` of two issuers is two identities.
    pub name: String,
}

impl Identity {
    /// Whether the client is a Client ID Metadata Document client (an https URL with a path).
    pub fn client_is_metadata_document(&self) -> bool {
        self.client
            .as_deref()
            .and_then(|c| url::Url::parse(c).ok())
            .is_some_and(|u| u.scheme() == "https" && u.path() != "/" && !u.path().is_empty())
    }
}

#[derive(Deserialize)]
struct Metadata {
    issuer: String,
    jwks_uri: Option<String>,
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    client_id: Option<String>,
    azp: Option<String>,
}

/// What is read of a token before any key: the issuer that decides which keys check it.
#[derive(Deserialize)]
struct Unverified {
    iss: Option<serde_json::Value>,
}

struct Keys {
    set: Arc<JwkSet>,
    fetched: Instant,
}

/// One trusted authorization server: its identifier and its keys.
struct Issuer {
    issuer: String,
    jwks_uri: String,
    keys: RwLock<Keys>,
    /// Held while the keys are refetched, so concurrent requests wait for one fetch.
    refresh: tokio::sync::Mutex<()>,
}

/// The configured issuers' tokens, checked. Cheap to share (`Arc` it); `verify` takes `&self`.
pub struct Verifier {
    /// `oauth.issuer` first, then `oauth.other_issuers`, in order.
    issuers: Vec<Issuer>,
    audience: String,
    http: reqwest::Client,
    leeway: u64,
}

impl Verifier {
    /// Find every issuer's metadata and read its keys: the bridge refuses to start without them
    /// (an unreachable issuer would otherwise refuse everyone later, less clearly).
    pub async fn discover(config: &OAuthConfig) -> Result<Verifier, OAuthError> {
        let audience = config.audience.clone().unwrap_or_default();
        let http = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(FETCH_TIMEOUT)
            .build()
            .map_err(|e| OAuthError::Fetch {
                url: config.issuer.clone().unwrap_or_default(),
                reason: e.to_string(),
            })?;
        let mut issuers = Vec::new();
        for issuer in config.issuers() {
            issuers.push(Issuer::discover(&http, issuer).await?);
        }
        Ok(Verifier {
            issuers,
            audience,
            http,
            leeway: LEEWAY_SECS,
        })
    }

    /// Clock skew allowed on `exp` and `nbf` instead of the default 30 s (0 in the tests,
    /// which check expiry without waiting for it).
    pub fn with_leeway(mut self, leeway: Duration) -> Self {
        self.leeway = leeway.as_secs();
        self
    }

    /// The first issuer (`oauth.issuer`).
    pub fn issuer(&self) -> &str {
        &self.issuers[0].issuer
    }

    /// Every trusted issuer, `oauth.issuer` first: the protected-resource metadata's
    /// `authorization_servers`.
    pub fn issuers(&self) -> Vec<&str> {
        self.issuers.iter().map(|i| i.issuer.as_str()).collect()
    }

    /// The audience a token must name (`aud`): `oauth.audience`.
    pub fn audience(&self) -> &str {
        &self.audience
    }

    /// The identity of `token` if one of the issuers signed it for this audience and it is in
    /// date. The checks, in order: length, header (an access token's `typ`) and algorithm, `iss` among the configured
    /// issuers exactly, the key among that issuer's keys, signature, `exp`/`nbf`, `aud`, `iss`
    /// again (as signed), `sub`.
    pub async fn verify(&self, token: &str) -> Result<Identity, TokenError> {
        if token.len() > MAX_TOKEN {
            return Err(TokenError::TooLong);
        }
        let header =
            jsonwebtoken::decode_header(token).map_err(|e| TokenError::Malformed(e.to_string()))?;
        if let Some(typ) = header.typ.as_deref()
            && !access_token_typ(typ)
        {
            return Err(TokenError::NotAnAccessToken(typ.chars().take(64).collect()));
        }
        if !asymmetric(header.alg) {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let claimed = unverified_issuer(token)?;
        let Some(index) = self.issuers.iter().position(|i| i.issuer == claimed) else {
            return Err(TokenError::UntrustedIssuer {
                found: claimed,
                trusted: self.issuers().join(", "),
            });
        };
        let issuer = &self.issuers[index];
        let kid = header.kid.clone();
        let jwk = match issuer.key(kid.as_deref(), false) {
            Some(k) => k,
            None => {
                issuer.refetch(&self.http).await;
                match issuer.key(kid.as_deref(), true) {
                    Some(k) => k,
                    None => return Err(self.unknown_key(index, kid)),
                }
            }
        };
        if let Some(alg) = jwk.common.key_algorithm
            && format!("{alg:?}") != format!("{:?}", header.alg)
        {
            return Err(TokenError::Algorithm(format!("{:?}", header.alg)));
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|e| TokenError::UnknownKey {
            issuer: issuer.issuer.clone(),
            kid: e.to_string(),
        })?;
        let mut validation = Validation::new(header.alg);
        validation.set_issuer(&[&issuer.issuer]);
        validation.set_audience(&[&self.audience]);
        validation.set_required_spec_claims(&["exp", "iss", "aud", "sub"]);
        validation.leeway = self.leeway;
        validation.validate_nbf = true;
        let data = jsonwebtoken::decode::<Claims>(token, &key, &validation)
            .map_err(|e| self.refusal(&issuer.issuer, e))?;
        let claims = data.claims;
        if claims.sub.is_empty() {
            return Err(TokenError::MissingClaim("sub".into()));
        }
        let name = self.identity_name(index, &claims.sub)?;
        let client = claims.client_id.or(claims.azp).filter(|c| !c.is_empty());
        Ok(Identity {
            issuer: issuer.issuer.clone(),
            subject: claims.sub,
            client,
            name,
        })
    }

    /// The bridge's identity of `subject` of the `index`th issuer: `sub` for the first (the
    /// identities of a bridge with one issuer, unchanged), `sub@issuer` for the others. No
    /// other issuer's identity can be made: the others' URLs hold no `@` (config check), so
    /// `sub@issuer` splits one way only, and a `sub` of the first that ends in `@` and another
    /// issuer is refused.
    fn identity_name(&self, index: usize, subject: &str) -> Result<String, TokenError> {
        if index > 0 {
            return Ok(format!("{subject}@{}", self.issuers[index].issuer));
        }
        match self.issuers[1..]
            .iter()
            .find(|o| subject.ends_with(&format!("@{}", o.issuer)))
        {
            Some(other) => Err(TokenError::SubjectOfAnotherIssuer {
                other: other.issuer.clone(),
            }),
            None => Ok(subject.to_string()),
        }
    }

    /// The refusal of a key id the `index`th issuer does not publish: another configured
    /// issuer's key (by the key sets already read, nothing fetched) is key confusion, named so.
    fn unknown_key(&self, index: usize, kid: Option<String>) -> TokenError {
        let claimed = self.issuers[index].issuer.clone();
        if let Some(kid) = kid.as_deref()
            && let Some(signer) = self
                .issuers
                .iter()
                .enumerate()
                .find(|(i, o)| *i != index && o.key(Some(kid), true).is_some())
        {
            return TokenError::KeyOfAnotherIssuer {
                claimed,
                signer: signer.1.issuer.clone(),
                kid: kid.to_string(),
            };
        }
        TokenError::UnknownKey {
            issuer: claimed,
            kid: kid.unwrap_or_else(|| "no kid".into()),
        }
    }

    fn refusal(&self, issuer: &str, e: jsonwebtoken::errors::Error) -> TokenError {
        use jsonwebtoken::errors::ErrorKind as K;
        match e.kind() {
            K::InvalidSignature => TokenError::BadSignature(issuer.to_string()),
            K::ExpiredSignature => TokenError::Expired,
            K::ImmatureSignature => TokenError::NotYetValid,
            K::InvalidAudience => TokenError::WrongAudience(self.audience.clone()),
            K::InvalidIssuer => TokenError::WrongIssuer(issuer.to_string()),
            K::MissingRequiredClaim(c) => TokenError::MissingClaim(c.clone()),
            K::InvalidAlgorithm | K::InvalidAlgorithmName | K::UnsupportedAlgorithm => {
                TokenError::Algorithm(e.to_string())
            }
            _ => TokenError::Malformed(e.to_string()),
        }
    }
}

impl Issuer {
    /// Find `issuer`'s metadata (which must name it identically) and read its keys.
    async fn discover(http: &reqwest::Client, issuer: String) -> Result<Issuer, OAuthError> {
        let mut tried = Vec::new();
        let mut found = None;
        for url in metadata_urls(&issuer) {
            match fetch_json::<Metadata>(http, &url).await {
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
        // RFC 8414 §3.3 and the MCP spec: identical, no normalisation (a trailing slash too).
        if meta.issuer != issuer {
            return Err(OAuthError::IssuerMismatch {
                issuer,
                url,
                found: meta.issuer,
            });
        }
        let jwks_uri = meta.jwks_uri.ok_or(OAuthError::NoJwksUri { url })?;
        let set = fetch_json::<JwkSet>(http, &jwks_uri)
            .await
            .map_err(|reason| OAuthError::Fetch {
                url: jwks_uri.clone(),
                reason,
            })?;
        tracing::info!(%issuer, keys = set.keys.len(), "OAuth issuer's keys read");
        Ok(Issuer {
            issuer,
            jwks_uri,
            keys: RwLock::new(Keys {
                set: Arc::new(set),
                fetched: Instant::now(),
            }),
            refresh: tokio::sync::Mutex::new(()),
        })
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
    async fn refetch(&self, http: &reqwest::Client) {
        let _one = self.refresh.lock().await;
        if self.keys.read().unwrap().fetched.elapsed() < MIN_REFRESH {
            return;
        }
        match fetch_json::<JwkSet>(http, &self.jwks_uri).await {
            Ok(set) => {
                *self.keys.write().unwrap() = Keys {
                    set: Arc::new(set),
                    fetched: Instant::now(),
                };
            }
            Err(reason) => {
                tracing::warn!(issuer = %self.issuer, url = %self.jwks_uri, %reason, "cannot refetch the OAuth issuer's keys; keeping the ones read before");
                // Wait MIN_REFRESH before the next try as after a success.
                self.keys.write().unwrap().fetched = Instant::now();
            }
        }
    }
}

/// The `iss` claim of `token`, read before its signature is checked: it only chooses which
/// issuer's keys check the token (the signed `iss` is checked again with them).
fn unverified_issuer(token: &str) -> Result<String, TokenError> {
    use base64::Engine as _;
    let payload = token
        .split('.')
        .nth(1)
        .ok_or_else(|| TokenError::Malformed("no payload".into()))?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .map_err(|e| TokenError::Malformed(format!("payload: {e}")))?;
    let claims: Unverified = serde_json::from_slice(&bytes)
        .map_err(|e| TokenError::Malformed(format!("payload: {e}")))?;
    match claims.iss {
        None => Err(TokenError::MissingClaim("iss".into())),
        Some(serde_json::Value::String(s)) => Ok(s),
        Some(_) => Err(TokenError::Malformed("iss is not a string".into())),
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

/// Whether a JWT header's `typ` may be an access token's: `at+jwt` (RFC 9068), or the generic
/// `JWT` many authorization servers still put there; media types compare case-insensitively,
/// with or without `application/` (RFC 7515 section 4.1.9).
fn access_token_typ(typ: &str) -> bool {
    let t = typ.to_ascii_lowercase();
    let t = t.strip_prefix("application/").unwrap_or(&t);
    matches!(t, "at+jwt" | "jwt")
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

    /// A verifier of two issuers with one EC key each (public halves only: the checks
    /// tested here all come before the signature's).
    fn two_issuers() -> Verifier {
        let issuer = |url: &str, kid: &str, x: &str, y: &str| {
            let set: JwkSet = serde_json::from_value(serde_json::json!({"keys": [{
                "kty": "EC", "crv": "P-256", "alg": "ES256", "use": "sig",
                "kid": kid, "x": x, "y": y,
            }]}))
            .unwrap();
            Issuer {
                issuer: url.into(),
                jwks_uri: format!("{url}/jwks"),
                keys: RwLock::new(Keys {
                    set: Arc::new(set),
                    fetched: Instant::now(),
                }),
                refresh: tokio::sync::Mutex::new(()),
            }
        };
        Verifier {
            issuers: vec![
                issuer(
                    "https://a.example",
                    "key-a",
                    "AAScHsTfmwR7tVlW5eb2oGpmhR969NSsdkkgnGkFUuY",
                    "Y3i6qGwMwzLUe11ALEP8q749Fd23P-6kQXDDCflHqNY",
                ),
                issuer(
                    "https://b.example/tenant",
                    "key-b",
                    "rq3MRDYZNikdXCJ8rzEk_fUgn59pl6vJTvRyAWP_BMQ",
                    "AuVZDtZjLSZt2TNyP94BW1E1FCwfa5t5h4MjgLIJr-g",
                ),
            ],
            audience: "https://bridge.example/mcp".into(),
            http: reqwest::Client::new(),
            leeway: 0,
        }
    }

    /// An unsigned ES256 token with `kid` and `claims` (its signature is made up).
    fn token(kid: &str, claims: serde_json::Value) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let header = b64.encode(format!(r#"{{"alg":"ES256","typ":"at+jwt","kid":"{kid}"}}"#));
        let payload = b64.encode(serde_json::to_vec(&claims).unwrap());
        format!("{header}.{payload}.c2lnbmF0dXJl")
    }

    /// `token` with its header's `typ` replaced (or removed, with `None`).
    fn typed(kid: &str, typ: Option<&str>) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let mut header = serde_json::json!({"alg": "ES256", "kid": kid});
        if let Some(t) = typ {
            header["typ"] = t.into();
        }
        let signed = token(kid, claims("https://a.example"));
        let rest = signed.split_once('.').unwrap().1;
        format!("{}.{rest}", b64.encode(header.to_string()))
    }

    #[tokio::test]
    async fn a_jwt_typed_as_anything_but_an_access_token_is_refused_before_its_key() {
        let v = two_issuers();
        for other in [
            "dpop+jwt",
            "logout+jwt",
            "secevent+jwt",
            "application/dpop+jwt",
            "JOSE",
        ] {
            assert_eq!(
                v.verify(&typed("key-a", Some(other))).await,
                Err(TokenError::NotAnAccessToken(other.into())),
                "{other}"
            );
        }
        // The access token's own types, and none, go on to the key and signature (made up here).
        for ours in [
            Some("at+jwt"),
            Some("application/at+jwt"),
            Some("AT+JWT"),
            Some("JWT"),
            None,
        ] {
            assert_eq!(
                v.verify(&typed("key-a", ours)).await,
                Err(TokenError::BadSignature("https://a.example".into())),
                "{ours:?}"
            );
        }
        // What is echoed of a long typ is bounded.
        let long = "x".repeat(500);
        let Err(TokenError::NotAnAccessToken(shown)) = v.verify(&typed("key-a", Some(&long))).await
        else {
            panic!("a long typ is refused as such");
        };
        assert_eq!(shown.len(), 64, "what is echoed is bounded");
    }

    fn claims(iss: &str) -> serde_json::Value {
        serde_json::json!({
            "iss": iss, "sub": "alice", "aud": "https://bridge.example/mcp", "exp": 4102444800u64,
        })
    }

    #[tokio::test]
    async fn the_issuer_must_be_configured_character_for_character() {
        let v = two_issuers();
        assert_eq!(
            v.issuers(),
            ["https://a.example", "https://b.example/tenant"]
        );
        for lookalike in [
            "https://a.example/",
            "HTTPS://a.example",
            "https://A.example",
            "https://a.example:443",
            "https://b.example/tenant/",
            "https://b.example",
            "https://b.example/tenant/x",
            "https://c.example",
        ] {
            let refused = v.verify(&token("key-a", claims(lookalike))).await;
            let Err(e @ TokenError::UntrustedIssuer { .. }) = refused else {
                panic!("{lookalike}: {refused:?}");
            };
            assert!(e.to_string().contains(lookalike), "{e}");
            assert!(
                e.message().contains("oauth.other_issuers"),
                "{}",
                e.message()
            );
        }
        let mut no_iss = claims("https://a.example");
        no_iss.as_object_mut().unwrap().remove("iss");
        assert_eq!(
            v.verify(&token("key-a", no_iss)).await,
            Err(TokenError::MissingClaim("iss".into()))
        );
        assert!(matches!(
            v.verify(&token("key-a", serde_json::json!({"iss": 7})))
                .await,
            Err(TokenError::Malformed(_))
        ));
    }

    #[tokio::test]
    async fn a_token_is_checked_with_the_keys_of_its_issuer_only() {
        let v = two_issuers();
        // Signed (by its kid) with a's key, claiming b: named as key confusion.
        let e = v
            .verify(&token("key-a", claims("https://b.example/tenant")))
            .await
            .unwrap_err();
        assert_eq!(
            e,
            TokenError::KeyOfAnotherIssuer {
                claimed: "https://b.example/tenant".into(),
                signer: "https://a.example".into(),
                kid: "key-a".into(),
            }
        );
        assert!(
            e.message().contains("keys of the issuer its iss names"),
            "{}",
            e.message()
        );
        // And the other way round.
        assert!(matches!(
            v.verify(&token("key-b", claims("https://a.example"))).await,
            Err(TokenError::KeyOfAnotherIssuer { ref signer, .. }) if signer == "https://b.example/tenant"
        ));
        // A key no one publishes.
        assert_eq!(
            v.verify(&token("key-z", claims("https://a.example"))).await,
            Err(TokenError::UnknownKey {
                issuer: "https://a.example".into(),
                kid: "key-z".into()
            })
        );
        // Its own issuer's key, made-up signature: the signature is what fails, by that issuer.
        assert_eq!(
            v.verify(&token("key-b", claims("https://b.example/tenant")))
                .await,
            Err(TokenError::BadSignature("https://b.example/tenant".into()))
        );
    }

    #[test]
    fn identities_are_keyed_by_issuer() {
        let v = two_issuers();
        // The first issuer's identities are its subjects, as with one issuer.
        assert_eq!(v.identity_name(0, "alice").unwrap(), "alice");
        assert_eq!(
            v.identity_name(1, "alice").unwrap(),
            "alice@https://b.example/tenant"
        );
        assert_ne!(
            v.identity_name(0, "alice").unwrap(),
            v.identity_name(1, "alice").unwrap()
        );
        // The first issuer cannot name a user of the second.
        let e = v
            .identity_name(0, "alice@https://b.example/tenant")
            .unwrap_err();
        assert_eq!(
            e,
            TokenError::SubjectOfAnotherIssuer {
                other: "https://b.example/tenant".into()
            }
        );
        assert!(e.message().contains("oauth.other_issuers"));
        // An e-mail-like subject is fine.
        assert_eq!(
            v.identity_name(0, "bob@example.com").unwrap(),
            "bob@example.com"
        );
    }

    #[test]
    fn a_metadata_document_client_is_an_https_url_with_a_path() {
        let id = |client: Option<&str>| Identity {
            issuer: "https://a.example".into(),
            subject: "alice".into(),
            client: client.map(Into::into),
            name: "alice".into(),
        };
        assert!(id(Some("https://app.example/oauth/client.json")).client_is_metadata_document());
        assert!(!id(Some("https://app.example")).client_is_metadata_document());
        assert!(!id(Some("http://app.example/client.json")).client_is_metadata_document());
        assert!(!id(Some("my-client")).client_is_metadata_document());
        assert!(!id(None).client_is_metadata_document());
    }

    #[test]
    fn every_refusal_says_what_to_do() {
        let all = [
            TokenError::Malformed("x".into()),
            TokenError::TooLong,
            TokenError::Algorithm("HS256".into()),
            TokenError::NotAnAccessToken("dpop+jwt".into()),
            TokenError::MissingClaim("sub".into()),
            TokenError::UntrustedIssuer {
                found: "https://c.example".into(),
                trusted: "https://a.example".into(),
            },
            TokenError::KeyOfAnotherIssuer {
                claimed: "b".into(),
                signer: "a".into(),
                kid: "k".into(),
            },
            TokenError::UnknownKey {
                issuer: "a".into(),
                kid: "k".into(),
            },
            TokenError::BadSignature("a".into()),
            TokenError::Expired,
            TokenError::NotYetValid,
            TokenError::WrongAudience("https://bridge.example/mcp".into()),
            TokenError::WrongIssuer("a".into()),
            TokenError::SubjectOfAnotherIssuer { other: "b".into() },
            TokenError::KeysUnavailable {
                issuer: "a".into(),
                reason: "down".into(),
            },
        ];
        for e in all {
            let m = e.message();
            assert!(m.len() > e.to_string().len() + 10, "{e:?}: {m}");
        }
        assert!(
            TokenError::WrongAudience("x".into())
                .message()
                .contains("oauth.audience")
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
