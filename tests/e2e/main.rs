//! End-to-end tests: the real `sous` binary, run from the workspace root on the shipped
//! recipes and the broken-recipe corpus in `tests/recipes/broken/`.

// A check that cannot run on this machine says so on stderr.
#![allow(clippy::print_stderr)]

mod aarch64;
mod architectures;
mod bench;
mod broken;
mod deploy;
mod doctor;
mod eval;
mod everyday;
mod faces;
mod hub_python;
mod native;
mod pipeline;
mod plan;
mod pull;
mod quantize;
mod quantize_gpu;
mod quantize_large;
mod quantize_moe;
mod quantize_reference;
mod quantize_util;
mod recipe;
mod route;
mod scrape_prometheus;
mod serve;
mod serve_run;
mod snapshot;
mod tune;
mod util;
