//! The `[oauth]` section: the authorization servers whose access tokens `serve` accepts, as an
//! OAuth 2.1 resource server (the MCP authorization spec). The verification itself is
//! `crate::oauth`; this is only its settings and their load-time checks.

use serde::{Deserialize, Serialize};

use super::http::Names;
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
    /// Further authorization servers whose tokens are accepted, each checked against its own
    /// metadata and keys; their identities are `sub@issuer` (those of `issuer` stay `sub`).
    #[serde(default)]
    pub other_issuers: Names,
}

impl OAuthConfig {
    /// Whether tokens of an issuer are accepted at all.
    pub fn enabled(&self) -> bool {
        self.issuer.is_some()
    }

    /// Every trusted issuer: `issuer` first, then `other_issuers` (empty entries skipped).
    pub fn issuers(&self) -> Vec<String> {
        self.issuer
            .iter()
            .chain(self.other_issuers.0.iter())
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
            .collect()
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
            if self.other_issuers.0.iter().any(|s| !s.trim().is_empty()) {
                return Err((
                    "oauth.other_issuers",
                    "is set but oauth.issuer is not; set oauth.issuer to the first (its identities are plain sub)".into(),
                ));
            }
            return Ok(());
        };
        check_issuer("oauth.issuer", issuer)?;
        let mut seen = vec![issuer.trim()];
        for other in self.other_issuers.0.iter().map(|s| s.trim()) {
            if other.is_empty() {
                continue;
            }
            check_issuer("oauth.other_issuers", other)?;
            // `sub@issuer` must name one issuer only: the issuer is what follows the last `@`.
            if other.contains('@') {
                return Err((
                    "oauth.other_issuers",
                    format!(
                        "{other:?} must not contain `@` (identities of its tokens are sub@issuer)"
                    ),
                ));
            }
            if seen.contains(&other) {
                return Err((
                    "oauth.other_issuers",
                    format!("{other:?} is listed twice (or is oauth.issuer)"),
                ));
            }
            seen.push(other);
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

/// An issuer identifier as RFC 8414 §2 has it: an https URL (plain http only on a loopback
/// host, for a test or a local provider) without query or fragment.
fn check_issuer(key: &'static str, issuer: &str) -> Result<(), (&'static str, String)> {
    let url = match url::Url::parse(issuer) {
        Ok(u) => u,
        Err(e) => return Err((key, format!("{issuer:?} is not a URL: {e}"))),
    };
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    };
    if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
        return Err((
            key,
            format!("{issuer:?} must be an https URL (plain http only on a loopback host)"),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err((
            key,
            format!("{issuer:?} must have no query or fragment (RFC 8414)"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(issuer: Option<&str>, audience: Option<&str>) -> Result<(), &'static str> {
        OAuthConfig {
            issuer: issuer.map(Into::into),
            audience: audience.map(Into::into),
            other_issuers: Names::default(),
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

    #[test]
    fn other_issuers_are_checked_like_the_first() {
        let check = |others: &[&str]| {
            OAuthConfig {
                issuer: Some("https://a.example".into()),
                audience: Some("https://bridge.example/mcp".into()),
                other_issuers: Names(others.iter().map(|s| s.to_string()).collect()),
            }
            .check()
        };
        assert_eq!(
            check(&["https://b.example", "http://127.0.0.1:9000"]),
            Ok(())
        );
        for bad in [
            &["http://b.example"][..],
            &["https://b.example/#x"],
            &["https://user@b.example"],
            &["https://a.example"],
            &["https://b.example", "https://b.example"],
        ] {
            let (key, why) = check(bad).unwrap_err();
            assert_eq!(key, "oauth.other_issuers", "{bad:?}: {why}");
        }
        let only_others = OAuthConfig {
            other_issuers: Names(vec!["https://b.example".into()]),
            ..OAuthConfig::default()
        };
        assert_eq!(only_others.check().unwrap_err().0, "oauth.other_issuers");
        assert_eq!(
            OAuthConfig {
                issuer: Some("https://a.example".into()),
                other_issuers: Names(vec!["https://b.example".into(), " ".into()]),
                ..OAuthConfig::default()
            }
            .issuers(),
            ["https://a.example", "https://b.example"]
        );
    }
}
