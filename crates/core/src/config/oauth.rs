//! The `[oauth]` section: the authorization server whose access tokens `serve` accepts, as an
//! OAuth 2.1 resource server (the MCP authorization spec). The verification itself is
//! `crate::oauth`; this is only its settings and their load-time checks.

use serde::{Deserialize, Serialize};

use super::values::empty_as_none;

/// `[oauth]`: off while `issuer` is unset.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OAuthConfig {
    /// The issuer's URL, exactly as its tokens' `iss` claim and its metadata say it.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub issuer: Option<String>,
    /// The `aud` a token must carry: this server's resource URL as the issuer knows it.
    #[serde(default, deserialize_with = "empty_as_none")]
    pub audience: Option<String>,
}

impl OAuthConfig {
    /// Whether tokens of an issuer are accepted at all.
    pub fn enabled(&self) -> bool {
        self.issuer.is_some()
    }

    /// Range checks, as `Config::validate` reports them: the key at fault and why. The issuer
    /// must be https (its keys decide who gets in), except on a loopback host, where a test
    /// or a local provider may speak plain HTTP; an issuer needs an audience, or a token made
    /// for any other service of the same issuer would be accepted here.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        let Some(issuer) = self.issuer.as_deref() else {
            if self.audience.is_some() {
                return Err((
                    "oauth.audience",
                    "is set but oauth.issuer is not; set the issuer whose tokens carry it".into(),
                ));
            }
            return Ok(());
        };
        let url = match url::Url::parse(issuer) {
            Ok(u) => u,
            Err(e) => return Err(("oauth.issuer", format!("{issuer:?} is not a URL: {e}"))),
        };
        let loopback = match url.host() {
            Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
            Some(url::Host::Ipv4(a)) => a.is_loopback(),
            Some(url::Host::Ipv6(a)) => a.is_loopback(),
            None => false,
        };
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err((
                "oauth.issuer",
                format!("{issuer:?} must be an https URL (plain http only on a loopback host)"),
            ));
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err((
                "oauth.issuer",
                format!("{issuer:?} must have no query or fragment (RFC 8414)"),
            ));
        }
        if self.audience.as_deref().is_none_or(|a| a.trim().is_empty()) {
            return Err((
                "oauth.audience",
                "must be set with oauth.issuer: the resource URL (for example https://bridge.example/mcp) the issuer puts in its tokens' aud".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(issuer: Option<&str>, audience: Option<&str>) -> Result<(), &'static str> {
        OAuthConfig {
            issuer: issuer.map(Into::into),
            audience: audience.map(Into::into),
        }
        .check()
        .map_err(|(k, _)| k)
    }

    #[test]
    fn issuer_and_audience_are_checked_together() {
        assert_eq!(check(None, None), Ok(()));
        assert_eq!(check(None, Some("x")), Err("oauth.audience"));
        assert_eq!(
            check(Some("https://id.example"), None),
            Err("oauth.audience")
        );
        assert_eq!(
            check(Some("https://id.example/realms/a"), Some("x")),
            Ok(())
        );
        assert_eq!(check(Some("http://127.0.0.1:9000"), Some("x")), Ok(()));
        assert_eq!(check(Some("http://localhost:9000"), Some("x")), Ok(()));
        assert_eq!(
            check(Some("http://id.example"), Some("x")),
            Err("oauth.issuer")
        );
        assert_eq!(check(Some("not a url"), Some("x")), Err("oauth.issuer"));
        assert_eq!(
            check(Some("https://id.example/?a=b"), Some("x")),
            Err("oauth.issuer")
        );
    }
}
