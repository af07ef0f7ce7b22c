//! End-to-end tests: the real `sous` binary, run from the workspace root on the shipped
//! recipes and the broken-recipe corpus in `tests/recipes/broken/`.

mod broken;
mod recipe;
mod serve;
mod util;
