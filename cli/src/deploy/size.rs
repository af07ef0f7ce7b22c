//! How large the model a recipe deploys is, to size the volume sous creates for it:
//! from a completed pull on this machine (its marker lists every file and size), from
//! the recipe's local directory, or from the Hub's file listing (sizes only, no
//! weights). `None` when none of them can tell.

use std::path::Path;

use sous_engine::recipe::{DEFAULT_REVISION, Recipe};

use crate::hub::api::HubClient;
use crate::hub::cache::{Marker, RepoCache};
use crate::hub::config::HubConfig;
use crate::hub::select::Selection;

/// The bytes `sous pull` would put on disk for `recipe`'s model (what serving needs:
/// the default file selection), or `None` when unknown.
pub async fn model_bytes(recipe: &Recipe, hub: &HubConfig) -> Option<u64> {
    let revision = recipe.model.revision.as_deref().unwrap_or(DEFAULT_REVISION);
    if let Some(path) = &recipe.model.path {
        let dir = Path::new(path);
        if let Some(marker) = Marker::read(&dir.join(".download-complete")) {
            return Some(marker.files.iter().map(|f| f.size).sum());
        }
        if let Some(bytes) = dir_bytes(dir) {
            return Some(bytes);
        }
    }
    let repo = recipe.model.repo.as_ref()?;
    let cache = RepoCache::new(&hub.cache_dir, repo);
    if let Some(commit) = cache.read_ref(revision)
        && let Some(marker) = Marker::read(&cache.marker(&commit))
    {
        return Some(marker.files.iter().map(|f| f.size).sum());
    }
    if hub.offline {
        return None;
    }
    let client = HubClient::new(hub.clone()).ok()?;
    let commit = client.revision(repo.as_str(), revision).await.ok()?.sha;
    let tree = client.tree(repo.as_str(), &commit).await.ok()?;
    let selection = Selection::new(&[], &[]).ok()?;
    let files: Vec<_> = tree.iter().filter(|e| e.kind == "file").collect();
    let chosen = selection.apply(files.iter().map(|e| e.path.as_str()));
    Some(
        files
            .iter()
            .filter(|e| chosen.contains(&e.path.as_str()))
            .map(|e| e.lfs.as_ref().map_or(e.size, |l| l.size))
            .sum(),
    )
}

/// The bytes of the regular files directly in `dir` and below, or `None` if it cannot
/// be read or holds nothing.
fn dir_bytes(dir: &Path) -> Option<u64> {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).ok()?.flatten() {
            // Not sous's locks and partial downloads (`.cache/`), nor other hidden files.
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = entry.metadata().ok()?;
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                total += meta.len();
            }
        }
    }
    (total > 0).then_some(total)
}
