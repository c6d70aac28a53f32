//! Who a request to `serve` is: a bearer token of `token_file` (its line's name), or an OAuth
//! access token of `oauth.issuer` (its `sub`) or of one of `oauth.other_issuers` (`sub@issuer`). Refusals carry what RFC 6750 and the MCP
//! authorization spec ask for: `WWW-Authenticate: Bearer`, with `resource_metadata` pointing at
//! the Protected Resource Metadata (RFC 9728) when OAuth is on, and `error="invalid_token"`
//! when a token was sent.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::oauth::{OAuthError, Verifier};
use bridge_core::config::Config;
use bridge_core::error::{Hint, Hinted};

/// Shortest token `token_file` may hold: guessing one must be hopeless.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest `Authorization` header read.
const MAX_HEADER: usize = 16 << 10;

/// Why authentication could not be set up at start.
#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    /// `token_file` could not be read.
    #[error("cannot read token_file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why it could not be read.
        source: std::io::Error,
    },
    /// A line of `token_file` is not a `name:token` this server takes (no `:`, a bad name, a
    /// short token, a name given twice).
    #[error("token_file {path}, line {line}: {why}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// `token_file` has only comments and blank lines; the field is the file.
    #[error("token_file {0} holds no token")]
    Empty(PathBuf),
    /// `oauth.issuer`'s metadata or keys could not be had.
    #[error("oauth.issuer: {0}")]
    OAuth(#[from] OAuthError),
}

impl Hinted for AuthSetupError {
    fn hint(&self) -> Option<Hint> {
        match self {
            AuthSetupError::Read { .. }
            | AuthSetupError::Empty(_)
            | AuthSetupError::Line { .. } => Some(Hint::clause(format!(
                "write one `name:token` per line, the token at least {MIN_TOKEN_LEN} characters (for example `alice:$(openssl rand -hex 32)`); lines starting with # are comments"
            ))),
            AuthSetupError::OAuth(e) => e.hint(),
        }
    }
}

/// One `token_file` line: the identity and its token's digest (what is compared, so the
/// comparison takes the same time whatever the lengths).
struct Token {
    name: String,
    digest: [u8; 32],
}

/// How `serve` authenticates requests. `None` of both: nobody is asked (loopback only).
pub struct Auth {
    tokens: Vec<Token>,
    verifier: Option<Arc<Verifier>>,
    /// The resource of the Protected Resource Metadata (`oauth.audience`, else
    /// `http.public_url`); derived from the request when neither is set.
    resource: Option<String>,
}

/// A refused request: the status, the `WWW-Authenticate` challenge and what went wrong.
#[derive(Debug)]
pub struct Refusal {
    /// The challenge's `error` (RFC 6750: `invalid_request`, `invalid_token`); none when the
    /// request sent no credentials.
    pub error: Option<&'static str>,
    /// What went wrong, for the person reading the client's log.
    pub description: String,
}

impl Auth {
    /// Read `token_file` and discover `oauth.issuer`; `Ok(None)` when neither is configured.
    pub async fn from_config(config: &Config) -> Result<Option<Auth>, AuthSetupError> {
        let tokens = match &config.token_file {
            Some(p) => read_tokens(p)?,
            None => Vec::new(),
        };
        let verifier = if config.oauth.enabled() {
            Some(Arc::new(Verifier::discover(&config.oauth).await?))
        } else {
            None
        };
        if tokens.is_empty() && verifier.is_none() {
            return Ok(None);
        }
        let resource = config
            .oauth
            .audience
            .clone()
            .filter(|a| url::Url::parse(a).is_ok())
            .or_else(|| config.http.public_url.clone());
        Ok(Some(Auth {
            tokens,
            verifier,
            resource,
        }))
    }

    /// What authenticates here, for the start-up log.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if !self.tokens.is_empty() {
            parts.push(format!(
                "{} bearer token(s) of token_file",
                self.tokens.len()
            ));
        }
        if let Some(v) = &self.verifier {
            parts.push(format!(
                "OAuth access tokens of {} for {}",
                v.issuers().join(", "),
                v.audience()
            ));
        }
        parts.join(" and ")
    }

    /// Whether OAuth is on (and so the Protected Resource Metadata is served).
    pub fn oauth_issuer(&self) -> Option<&str> {
        self.verifier.as_deref().map(Verifier::issuer)
    }

    /// Every trusted issuer, `oauth.issuer` first (empty when OAuth is off): the metadata's
    /// `authorization_servers`.
    pub fn oauth_issuers(&self) -> Vec<&str> {
        self.verifier
            .as_deref()
            .map(Verifier::issuers)
            .unwrap_or_default()
    }

    /// The resource URL of the metadata; `fallback` is the one derived from the request.
    pub fn resource(&self, fallback: String) -> String {
        self.resource.clone().unwrap_or(fallback)
    }

    /// The identity of the request with this `Authorization` header value.
    pub async fn check(&self, header: Option<&[u8]>) -> Result<String, Refusal> {
        let Some(header) = header else {
            return Err(Refusal {
                error: None,
                description:
                    "this server needs a bearer token: send `Authorization: Bearer <token>`".into(),
            });
        };
        let token = bearer(header).ok_or_else(|| Refusal {
            error: Some("invalid_request"),
            description: "the Authorization header is not `Bearer <token>`".into(),
        })?;
        if let Some(name) = self.token_name(token) {
            return Ok(name);
        }
        match &self.verifier {
            // A token of the file never looks like a JWT to the verifier (no dots): its
            // refusal says what a JWT failed, which is only worth saying when it was one.
            Some(v) if token.split('.').count() == 3 => match v.verify(token).await {
                Ok(id) => {
                    tracing::debug!(
                        identity = %id.name,
                        issuer = %id.issuer,
                        client = id.client.as_deref().unwrap_or("-"),
                        metadata_document = id.client_is_metadata_document(),
                        "OAuth access token accepted"
                    );
                    Ok(id.name)
                }
                Err(e) => Err(Refusal {
                    error: Some("invalid_token"),
                    description: e.message(),
                }),
            },
            _ => Err(Refusal {
                error: Some("invalid_token"),
                description: "the bearer token is not one this server accepts".into(),
            }),
        }
    }

    /// The name of the `token_file` line whose token is `token`. Every line is compared, in
    /// constant time, so the time taken says nothing of which line (if any) came close.
    fn token_name(&self, token: &str) -> Option<String> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for t in &self.tokens {
            if bool::from(t.digest.ct_eq(&digest)) {
                found = Some(t.name.clone());
            }
        }
        found
    }
}

/// The token of `Bearer <token>` (the scheme in any case, RFC 7235).
fn bearer(header: &[u8]) -> Option<&str> {
    if header.len() > MAX_HEADER {
        return None;
    }
    let s = std::str::from_utf8(header).ok()?.trim();
    let (scheme, token) = s.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && !token.contains(' '))
        .then_some(token)
}

/// The tokens of `path`: `name:token` per line, `#` comments and blank lines skipped. A
/// file others can read is used with a warning (its tokens are as good as published).
fn read_tokens(path: &Path) -> Result<Vec<Token>, AuthSetupError> {
    use std::os::unix::fs::PermissionsExt;
    let text = std::fs::read_to_string(path).map_err(|source| AuthSetupError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    if let Ok(m) = std::fs::metadata(path)
        && m.permissions().mode() & 0o044 != 0
    {
        tracing::warn!(
            path = %path.display(),
            "token_file can be read by other users; `chmod 600` it"
        );
    }
    let line_err = |line: usize, why: String| AuthSetupError::Line {
        path: path.to_path_buf(),
        line,
        why,
    };
    let mut tokens: Vec<Token> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, token)) = line.split_once(':') else {
            return Err(line_err(
                i + 1,
                "has no `:` between the name and the token".into(),
            ));
        };
        let (name, token) = (name.trim(), token.trim());
        if name.is_empty() || name.len() > 128 || name.chars().any(|c| c.is_control() || c == '/') {
            return Err(line_err(
                i + 1,
                "the name must be 1-128 characters, without `/` or control characters".into(),
            ));
        }
        if token.len() < MIN_TOKEN_LEN || token.contains(char::is_whitespace) {
            return Err(line_err(
                i + 1,
                format!(
                    "the token of {name:?} is shorter than {MIN_TOKEN_LEN} characters or holds spaces"
                ),
            ));
        }
        if tokens.iter().any(|t| t.name == name) {
            return Err(line_err(i + 1, format!("{name:?} is named twice")));
        }
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if tokens.iter().any(|t| t.digest == digest) {
            return Err(line_err(
                i + 1,
                format!("the token of {name:?} is another name's too; each identity needs its own"),
            ));
        }
        tokens.push(Token {
            name: name.to_string(),
            digest,
        });
    }
    if tokens.is_empty() {
        return Err(AuthSetupError::Empty(path.to_path_buf()));
    }
    Ok(tokens)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auth(file: &str) -> Result<Auth, AuthSetupError> {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("tokens");
        std::fs::write(&p, file).unwrap();
        Ok(Auth {
            tokens: read_tokens(&p)?,
            verifier: None,
            resource: None,
        })
    }

    #[tokio::test]
    async fn tokens_name_their_identity() {
        let a =
            auth("# team\nalice: aaaaaaaaaaaaaaaaaaaa\n\nbob:bbbbbbbbbbbbbbbbbbbbbbbb\n").unwrap();
        assert_eq!(
            a.check(Some(b"Bearer aaaaaaaaaaaaaaaaaaaa")).await.unwrap(),
            "alice"
        );
        assert_eq!(
            a.check(Some(b"bearer  bbbbbbbbbbbbbbbbbbbbbbbb "))
                .await
                .unwrap(),
            "bob"
        );
        let wrong = a
            .check(Some(b"Bearer aaaaaaaaaaaaaaaaaaab"))
            .await
            .unwrap_err();
        assert_eq!(wrong.error, Some("invalid_token"));
        assert_eq!(a.check(None).await.unwrap_err().error, None);
        assert_eq!(
            a.check(Some(b"Basic YWxpY2U6eA=="))
                .await
                .unwrap_err()
                .error,
            Some("invalid_request")
        );
    }

    #[test]
    fn bad_files_say_which_line() {
        for (file, needle) in [
            ("alice\n", "line 1: has no `:`"),
            (
                "# c\nalice:short\n",
                "line 2: the token of \"alice\" is shorter",
            ),
            (
                "a:aaaaaaaaaaaaaaaaaaaa\na:bbbbbbbbbbbbbbbbbbbbbb\n",
                "named twice",
            ),
            (
                "a:aaaaaaaaaaaaaaaaaaaa\nb:aaaaaaaaaaaaaaaaaaaa\n",
                "another name's too",
            ),
            ("a/b:aaaaaaaaaaaaaaaaaaaa\n", "without `/`"),
            ("# nothing\n", "holds no token"),
        ] {
            let e = auth(file)
                .err()
                .unwrap_or_else(|| panic!("{file:?} accepted"));
            assert!(e.to_string().contains(needle), "{file:?}: {e}");
        }
    }
}
