//! Placing packed matrices in one huge-page mapping ([`crate::pages::place`]) changes
//! where their bytes live, never the products or rows they give. These tests live with
//! the products because they build [`Packed`] matrices; the mapping itself is tested in
//! `pages`.

use super::{Packed, matmul};
use crate::pages::{HUGE_PAGE, Placement, place, smaps_field};

fn values(len: usize, seed: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 + seed * 104_729) % 2003) as f32 / 1000.0 - 1.0)
        .collect()
}

fn bf16(v: &[f32]) -> Vec<u16> {
    v.iter().map(|x| (x.to_bits() >> 16) as u16).collect()
}

/// Every format, sizes that are not multiples of anything in particular (odd panel
/// counts, a bf16 `k` that needs a pair partner), and enough bytes that the mapping
/// spans more than one huge page.
fn matrices() -> Vec<Packed> {
    let nvfp4 = |n: usize, k: usize, seed: usize| {
        let codes: Vec<u8> = (0..n * k / 2).map(|i| ((i * 37 + seed) % 251) as u8).collect();
        let scales: Vec<u8> = (0..n * k / 16).map(|i| 0x30 + ((i + seed) % 16) as u8).collect();
        Packed::from_nvfp4(&codes, &scales, |s| f32::from(s) * 1e-3, n, k).expect("block-aligned")
    };
    vec![
        Packed::from_bf16(&bf16(&values(2048 * 576, 1)), 2048, 576).expect("sizes"),
        Packed::from_f32(&values(40 * 33, 2), 40, 33).expect("sizes"),
        Packed::from_bf16(&bf16(&values(24 * 35, 3)), 24, 35).expect("sizes"),
        nvfp4(48, 64, 4),
        Packed::q8_0(&values(40 * 64, 5), 40, 64).expect("sizes"),
        Packed::from_bf16(&bf16(&values(1024 * 1536, 6)), 1024, 1536).expect("sizes"),
    ]
}

/// Products of 1 and 7 rows and every row of the matrix, as bits.
fn fingerprint(w: &Packed) -> Vec<u32> {
    let mut bits = Vec::new();
    for rows in [1, 7] {
        let x = values(rows * w.k(), 9);
        let mut out = vec![0.0f32; rows * w.n()];
        matmul(&x, rows, w, &mut out);
        bits.extend(out.iter().map(|v| v.to_bits()));
    }
    let mut row = vec![0.0f32; w.k()];
    for r in 0..w.n() {
        w.row(r, &mut row);
        bits.extend(row.iter().map(|v| v.to_bits()));
    }
    bits
}

#[test]
fn placed_weights_give_the_same_products_and_rows() {
    let mut weights = matrices();
    let before: Vec<Vec<u32>> = weights.iter().map(fingerprint).collect();
    let bytes: u64 = weights.iter().map(Packed::bytes).sum();
    let placement = {
        let mut refs: Vec<&mut Packed> = weights.iter_mut().collect();
        place(&mut refs)
            .expect("an anonymous mapping")
            .expect("bytes to move")
    };
    // Each buffer rounded up to a cache line (the NVFP4 tables stay on the heap).
    assert!(placement.bytes >= bytes - 256 * 4 && placement.bytes < bytes + 12 * 64);
    for (w, before) in weights.iter().zip(&before) {
        assert_eq!(
            &fingerprint(w),
            before,
            "a {} matrix changed when placed",
            w.format()
        );
        assert_eq!(w.first_byte() as usize % 64, 0, "a placed buffer is not aligned");
    }
    // A clone shares the mapping and outlives the rest.
    let kept = weights[3].clone();
    drop(weights);
    assert_eq!(fingerprint(&kept), before[3]);
}

#[test]
fn stacking_placed_weights_copies_them_back() {
    let parts = || {
        vec![
            Packed::from_bf16(&bf16(&values(32 * 40, 1)), 32, 40).expect("sizes"),
            Packed::from_bf16(&bf16(&values(16 * 40, 2)), 16, 40).expect("sizes"),
        ]
    };
    let expected = fingerprint(&Packed::stack(parts()).expect("stackable"));
    let mut placed = parts();
    place(&mut placed.iter_mut().collect::<Vec<_>>()).expect("an anonymous mapping");
    assert_eq!(fingerprint(&Packed::stack(placed).expect("stackable")), expected);
}

#[cfg(target_os = "linux")]
#[test]
fn the_mapping_is_advised_for_huge_pages_and_reported() {
    let mut weights = matrices();
    let placement = place(&mut weights.iter_mut().collect::<Vec<_>>())
        .expect("an anonymous mapping")
        .expect("bytes to move");
    let at = weights[0].first_byte();
    assert_eq!(
        at as usize % HUGE_PAGE,
        0,
        "the first buffer does not start the mapping"
    );
    let flags = smaps_field(at, "VmFlags").expect("/proc/self/smaps lists the mapping");
    assert!(
        flags.split_whitespace().any(|f| f == "hg"),
        "the mapping is not advised for huge pages: {flags}"
    );
    // Whether the kernel gave huge pages is the system's call, but smaps says.
    let huge = placement.huge_bytes.expect("smaps has AnonHugePages");
    assert!(huge <= placement.bytes);
    assert!(placement.to_string().contains("MiB of weights in one mapping"));
    let none = Placement {
        huge_bytes: Some(0),
        mode: Some("never".into()),
        ..placement.clone()
    };
    assert!(
        none.to_string()
            .ends_with("(none of it in huge pages: THP is `never` here)")
    );
}
