//! Who a request comes from, and how that keeps users apart. Under `serve` every request has an
//! identity (a `token_file` name, or an OAuth token's `sub`); over stdio there is one user and
//! no identity ([`Identity::Local`]). A sandbox session is found by its [`SessionKey`], built
//! once where a request enters (`server`) and passed whole to the sandbox, the policy's grants,
//! the RPC context, skills, tasks and audit: no part splits a key apart again.

/// Who a request comes from: the one user of stdio (and of `serve` without authentication),
/// or an identity `serve` authenticated. `serve` puts it in the request's extensions for the
/// MCP handler (`http::request::Parts` reach it in rmcp's request context).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum Identity {
    /// The one user of a bridge without authentication.
    #[default]
    Local,
    /// A `token_file` name or an OAuth token's `sub`.
    Named(String),
}

impl Identity {
    /// The identity of an MCP request: [`Identity::Local`] over stdio.
    pub fn of_request(extensions: &rmcp::model::Extensions) -> Identity {
        extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<Identity>())
            .cloned()
            .unwrap_or_default()
    }

    /// The authenticated name, as audit records carry it; `None` for the local user.
    pub fn name(&self) -> Option<&str> {
        match self {
            Identity::Local => None,
            Identity::Named(n) => Some(n),
        }
    }
}

/// A sandbox session: its owner and its name. Everything kept per session (the interpreter,
/// its files, "allow for this session" answers, tasks) is found by the whole key, so a session
/// of another identity is not a name this one can make: it is absent, by the type. Session
/// names never contain `/` (`RunArgs::parse`), so the [`Display`](std::fmt::Display) form,
/// `identity/name` (the name alone for the local user), names one key only.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    owner: Identity,
    name: String,
}

impl SessionKey {
    /// Session `name` of `owner`. `name` is taken as it is: the caller has checked it.
    pub fn new(owner: Identity, name: impl Into<String>) -> SessionKey {
        SessionKey {
            owner,
            name: name.into(),
        }
    }

    /// Session `name` of the local user.
    pub fn local(name: impl Into<String>) -> SessionKey {
        SessionKey::new(Identity::Local, name)
    }

    /// Whose session it is.
    pub fn owner(&self) -> &Identity {
        &self.owner
    }

    /// The session's name as its owner gave it (what the model and the results see).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// The session of a call that names none, and of a connection without a default of its own.
pub const DEFAULT_SESSION: &str = "default";

impl Default for SessionKey {
    /// The local user's default session.
    fn default() -> SessionKey {
        SessionKey::local(DEFAULT_SESSION)
    }
}

impl std::fmt::Display for SessionKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.owner {
            Identity::Local => f.write_str(&self.name),
            Identity::Named(id) => write!(f, "{id}/{}", self.name),
        }
    }
}

/// The default interpreter of a request made in an MCP session of Streamable HTTP (2025-11-25
/// and older, the `Mcp-Session-Id` header): that MCP session's own, so two connections of one
/// identity do not share state unless they name a session. A name, not the id itself (the id
/// stays between the client and the server): `mcp-` and 16 hex digits of its SHA-256. `None`
/// over stdio (one client) and for 2026-07-28 requests, which have no connection.
pub fn mcp_session(extensions: &rmcp::model::Extensions) -> Option<String> {
    let id = extensions
        .get::<http::request::Parts>()?
        .headers
        .get("mcp-session-id")?;
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(id.as_bytes());
    Some(format!("mcp-{}", &hex::encode(digest)[..16]))
}

/// A file name for `identity`'s own directories (its saved skills): the identity itself when it
/// is a plain name, else `id-` and a digest of it, so no identity can name a path outside the
/// directory or another identity's.
pub fn dir_name(identity: &str) -> String {
    let plain = !identity.is_empty()
        && identity.len() <= 64
        && !identity.starts_with('.')
        && !identity.starts_with("id-")
        && identity
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.@".contains(&b));
    if plain {
        return identity.to_string();
    }
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(identity.as_bytes());
    format!("id-{}", &hex::encode(digest)[..32])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_keep_identities_apart() {
        let named = |id: &str| Identity::Named(id.into());
        assert_eq!(SessionKey::local("default").to_string(), "default");
        let k = SessionKey::new(named("a/b"), "default");
        assert_eq!(k.to_string(), "a/b/default");
        assert_eq!((k.owner(), k.name()), (&named("a/b"), "default"));
        assert_ne!(k, SessionKey::new(named("a"), "b/default"));
        assert_ne!(k, SessionKey::local("default"));
        assert_ne!(
            SessionKey::local("default"),
            SessionKey::new(named("stdio"), "default")
        );
        assert_eq!(
            Identity::of_request(&rmcp::model::Extensions::new()),
            Identity::Local
        );
    }

    #[test]
    fn an_mcp_session_has_its_own_default_interpreter() {
        let parts = |id: Option<&str>| {
            let mut b = http::Request::builder();
            if let Some(id) = id {
                b = b.header("mcp-session-id", id);
            }
            let mut e = rmcp::model::Extensions::new();
            e.insert(b.body(()).unwrap().into_parts().0);
            e
        };
        assert_eq!(mcp_session(&rmcp::model::Extensions::new()), None);
        assert_eq!(mcp_session(&parts(None)), None);
        let a = mcp_session(&parts(Some("0b7e5a52-0a8c-4c0a-9f8e-1d2c3b4a5f60"))).unwrap();
        let b = mcp_session(&parts(Some("5c1d0f9e-7a6b-4e3d-8c2b-1a0f9e8d7c6b"))).unwrap();
        assert_ne!(a, b);
        assert!(a.starts_with("mcp-") && a.len() == 20, "{a}");
        assert!(
            !a.contains("0b7e5a52"),
            "the id itself is not the name: {a}"
        );
    }

    #[test]
    fn directory_names_stay_inside() {
        assert_eq!(dir_name("alice"), "alice");
        assert_eq!(dir_name("bob@example.com"), "bob@example.com");
        for hostile in [
            "..",
            ".",
            "",
            "a/b",
            "../x",
            "id-abc",
            "auth0|123",
            &"x".repeat(65),
        ] {
            let d = dir_name(hostile);
            assert!(d.starts_with("id-") && d.len() == 35, "{hostile:?} -> {d}");
        }
        assert_ne!(dir_name("a/b"), dir_name("a_b"));
    }
}
