//! Every case of `tests/fixtures/nvfp4/nvfp4_test_vectors.json` (bytes written by the
//! real compressed-tensors 0.19.0 and ModelOpt 0.47.0; `docs/nvfp4.md`, "Test
//! vectors"), through the reference and every fast kernel this CPU runs, for every
//! flavour.
//!
//! If the file is missing, that is reported loudly and the test returns; in CI it fails.

#![allow(clippy::print_stderr)]

use std::path::PathBuf;

use serde::Deserialize;
use sous_kernels::fast::{self, Kernel};
use sous_kernels::{Dtype, Flavor, Matrix, TensorScale, reference};

#[derive(Deserialize)]
struct Case {
    name: String,
    inputs: Vec<Input>,
    compressed_tensors_0_19: Vec<Expected>,
    modelopt_0_47_cpu: Vec<Expected>,
    modelopt_cuda_arith: Vec<Expected>,
}

#[derive(Deserialize)]
struct Input {
    shape: [usize; 2],
    bf16_bits: Vec<u16>,
}

#[derive(Deserialize)]
struct Expected {
    #[serde(alias = "weight_scale_2")]
    weight_global_scale: String,
    weight_scale_e4m3_bytes: Vec<u8>,
    #[serde(alias = "weight_bytes")]
    weight_packed_bytes: Vec<u8>,
}

fn cases() -> Option<Vec<Case>> {
    // Bytes the real tools produced, kept with the other NVFP4 fixtures.
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/nvfp4/nvfp4_test_vectors.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => Some(serde_json::from_str(&text).expect("the test vectors parse")),
        Err(err) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{} is missing in CI: {err}",
                path.display()
            );
            eprintln!(
                "SKIPPED: NVFP4 test vectors missing at {} ({err})",
                path.display()
            );
            None
        }
    }
}

fn hex_f32(text: &str) -> f32 {
    let digits = text.trim_start_matches("0x");
    f32::from_bits(u32::from_str_radix(digits, 16).expect("hex float bits"))
}

fn check(flavor: Flavor, pick: impl Fn(&Case) -> &Vec<Expected>) {
    let Some(cases) = cases() else { return };
    assert_eq!(cases.len(), 3, "the vector file changed: review this test");
    for case in &cases {
        let bytes: Vec<Vec<u8>> = case
            .inputs
            .iter()
            .map(|input| input.bf16_bits.iter().flat_map(|b| b.to_le_bytes()).collect())
            .collect();
        let matrices: Vec<Matrix> = case
            .inputs
            .iter()
            .zip(&bytes)
            .map(|(input, data)| {
                Matrix::new(Dtype::Bf16, input.shape[0], input.shape[1], data).expect("valid shape")
            })
            .collect();
        // A case with several inputs is a fused group: one amax, one scale for all.
        let amax = reference::group_amax(&matrices);
        assert_eq!(
            fast::group_amax(&matrices).to_bits(),
            amax.to_bits(),
            "{}",
            case.name
        );
        let scale = TensorScale::from_amax(flavor, Dtype::Bf16, amax);
        let expected = pick(case);
        assert_eq!(expected.len(), matrices.len());
        for (i, (matrix, want)) in matrices.iter().zip(expected).enumerate() {
            let what = format!("{} input {i} {flavor:?}", case.name);
            assert_eq!(
                scale.value().to_bits(),
                hex_f32(&want.weight_global_scale).to_bits(),
                "{what}: global scale"
            );
            let got = reference::quantize(matrix, &scale);
            assert_eq!(
                got.scales, want.weight_scale_e4m3_bytes,
                "{what}: reference block scales"
            );
            assert_eq!(
                got.packed, want.weight_packed_bytes,
                "{what}: reference packed codes"
            );
            for kernel in Kernel::available() {
                let fast = fast::quantize_with(kernel, matrix, &scale);
                assert_eq!(fast, got, "{what}: {} kernel", kernel.name());
            }
        }
    }
}

#[test]
fn compressed_tensors_0_19() {
    check(Flavor::CompressedTensors, |c| &c.compressed_tensors_0_19);
}

#[test]
fn modelopt_0_47_cpu_export() {
    check(Flavor::ModelOptCpu, |c| &c.modelopt_0_47_cpu);
}

#[test]
fn modelopt_0_47_gpu_export() {
    check(Flavor::ModelOptGpu, |c| &c.modelopt_cuda_arith);
}
