//! Where sous keeps its own state: one directory per deployment, holding what a
//! running instance needs (engine option files, `engine.log`, `instance.json`).
//!
//! `SOUS_STATE_DIR` wins; else `$XDG_STATE_HOME/sous`; else `~/.local/state/sous`, as
//! the XDG base-directory specification places state that survives restarts.
//!
//! Artifacts sous can rebuild (quantized checkpoints) go to the cache instead:
//! `SOUS_CACHE_DIR`, else `$XDG_CACHE_HOME/sous`, else `~/.cache/sous`.

use std::path::PathBuf;

/// The root of sous's state.
pub fn state_dir() -> PathBuf {
    state_dir_from(crate::env::lookup_os)
}

/// [`state_dir`] with the environment given, for tests.
pub fn state_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    if let Some(dir) = var("SOUS_STATE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("sous");
    }
    let home = var("HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/sous")
}

/// The root of sous's cache.
pub fn cache_dir() -> PathBuf {
    cache_dir_from(crate::env::lookup_os)
}

/// [`cache_dir`] with the environment given, for tests.
pub fn cache_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> PathBuf {
    if let Some(dir) = var("SOUS_CACHE_DIR").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir);
    }
    if let Some(dir) = var("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(dir).join("sous");
    }
    let home = var("HOME")
        .filter(|v| !v.is_empty())
        .map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".cache/sous")
}

/// Where a recipe's quantized checkpoint goes in the cache `cache`.
pub fn quantized_dir_in(cache: &std::path::Path, name: &str) -> PathBuf {
    cache.join("quantized").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn follows_xdg() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| (*v).into())
        };
        assert_eq!(
            state_dir_from(env(&[("SOUS_STATE_DIR", "/s"), ("HOME", "/h")])),
            PathBuf::from("/s")
        );
        assert_eq!(
            state_dir_from(env(&[("XDG_STATE_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/sous")
        );
        assert_eq!(
            state_dir_from(env(&[("HOME", "/h")])),
            PathBuf::from("/h/.local/state/sous")
        );
        assert_eq!(
            cache_dir_from(env(&[("SOUS_CACHE_DIR", "/c"), ("HOME", "/h")])),
            PathBuf::from("/c")
        );
        assert_eq!(
            cache_dir_from(env(&[("XDG_CACHE_HOME", "/x"), ("HOME", "/h")])),
            PathBuf::from("/x/sous")
        );
        assert_eq!(
            cache_dir_from(env(&[("HOME", "/h")])),
            PathBuf::from("/h/.cache/sous")
        );
    }
}
