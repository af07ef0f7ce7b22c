//! The committed schema (`recipes/recipe.schema.json`) and reference (`docs/recipe.md`)
//! are generated from the recipe types; this fails when either is stale. Regenerate
//! with `SOUS_BLESS=1 cargo test -p sous-engine --test schema_fresh`.

use std::path::PathBuf;

use sous_engine::recipe::schema;

fn check(relative: &str, generated: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(relative);
    if std::env::var_os("SOUS_BLESS").is_some() {
        std::fs::write(&path, generated).expect("write generated file");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "{relative} is stale: regenerate it with `SOUS_BLESS=1 cargo test -p sous-engine --test schema_fresh`"
    );
}

#[test]
fn json_schema_is_fresh() {
    check("recipes/recipe.schema.json", &schema::json_schema());
}

#[test]
fn recipe_reference_is_fresh() {
    check("docs/recipe.md", &schema::markdown());
}
