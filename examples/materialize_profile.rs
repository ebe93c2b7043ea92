//! Where a materialize's time goes, stage by stage, next to a page-cache copy of the same file (medians of N).
//! `cargo run --release --example materialize_profile -- <slot file> [N] [work dir]`
//! `load` and `rebuild` hand their bytes to the caller, so they run in fresh memory; `materialize` runs in the
//! buffers the store keeps between restores (store/buffers.rs), as a server's restores do.
use std::fs;
use std::path::PathBuf;
use std::time::Instant;

use kvstore_core::store::{Store, Target};

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let file = PathBuf::from(&args[1]);
    let n: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(30);
    let work = PathBuf::from(args.get(3).map(String::as_str).unwrap_or("/tmp/kvs_profile"));
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    let bytes = fs::read(&file).unwrap();
    let s = Store::open(&work.join("store"), 32, 1, 1 << 30).unwrap();
    s.ingest("x", "", &bytes, &Default::default(), None, false).unwrap();
    let t = Target::Name { namespace: "", name: "x" };
    let (mut copy, mut load, mut rebuild, mut write, mut hash, mut whole) = (vec![], vec![], vec![], vec![], vec![], vec![]);
    for i in 0..n {
        let out = work.join(format!("out{}", i % 4));
        let t0 = Instant::now();
        fs::copy(&file, &out).unwrap();
        copy.push(t0.elapsed().as_secs_f64());
        fs::remove_file(&out).unwrap();
        let t0 = Instant::now();
        s.load(&t, None).unwrap();
        load.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        let (_, rebuilt) = s.rebuild(&t, None, None).unwrap();
        rebuild.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        blake3::hash(&rebuilt);
        hash.push(t0.elapsed().as_secs_f64());
        let t0 = Instant::now();
        fs::write(&out, &rebuilt).unwrap();
        write.push(t0.elapsed().as_secs_f64());
        fs::remove_file(&out).unwrap();
        let t0 = Instant::now();
        s.materialize(&t, &out, None, None, false).unwrap();
        whole.push(t0.elapsed().as_secs_f64());
        assert!(fs::read(&out).unwrap() == bytes);
        fs::remove_file(&out).unwrap();
    }
    let mb = bytes.len() as f64 / 1e6;
    let row = |k: &str, v: Vec<f64>| {
        let m = median(v);
        println!("{k:34} {:7.2} ms {:7.0} MB/s", m * 1e3, mb / m);
    };
    println!("{} ({mb:.1} MB), medians of {n}", file.display());
    row("copy (page cache -> new file)", copy);
    row("load (read + decode objects)", load);
    row("rebuild (load + recompose + hash)", rebuild);
    row("blake3 of the file", hash);
    row("write the rebuilt file", write);
    row("materialize (all of it)", whole);
}
