//! Ingest/materialize throughput vs a plain copy of the same bytes, same run (like bench/storage.py, without a
//! server). `cargo run --release --example storage_bench -- <dir of *.bin> [repeats] [work dir]`
use std::fs::{self, File};
use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use kvstore_core::store::{Store, Target};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(args.get(1).map(String::as_str).unwrap_or("/tmp/kvs_states"));
    let repeats: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(5);
    let work = PathBuf::from(args.get(3).map(String::as_str).unwrap_or("/tmp/kvs_bench"));
    let pat = std::env::var("BENCH_FILES").unwrap_or_else(|_| "smollm2_parent,smollm2_child,gemma3_parent,gemma3_child".into());
    let names: Vec<&str> = pat.split(',').collect();
    let files: Vec<(String, Vec<u8>)> =
        names.iter().map(|n| (n.to_string(), fs::read(dir.join(format!("{n}.bin"))).unwrap())).collect();
    let raw: usize = files.iter().map(|f| f.1.len()).sum();
    let _ = fs::remove_dir_all(&work);
    fs::create_dir_all(&work).unwrap();
    let fp = Default::default();
    let mut best: std::collections::BTreeMap<&str, f64> = Default::default();
    let mut all: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    let mut rec = |k: &'static str, dt: f64| {
        let e = best.entry(k).or_insert(dt);
        *e = e.min(dt);
        all.entry(k).or_default().push(raw as f64 / dt / 1e6);
    };
    for rep in 0..repeats {
        let cd = work.join(format!("copy{rep}"));
        fs::create_dir_all(&cd).unwrap();
        let t = Instant::now();
        for (n, _) in &files {
            let dst = cd.join(n);
            fs::copy(dir.join(format!("{n}.bin")), &dst).unwrap();
            File::open(&dst).unwrap().sync_all().unwrap();
        }
        rec("copy_fsync", t.elapsed().as_secs_f64());
        let t = Instant::now();
        for (n, _) in &files {
            fs::copy(dir.join(format!("{n}.bin")), cd.join(format!("{n}.2"))).unwrap();
        }
        rec("copy", t.elapsed().as_secs_f64());
        let s = Store::open(&work.join(format!("store{rep}")), 32, 1, 1 << 30).unwrap();
        let t = Instant::now();
        for (n, b) in &files {
            let parent = if n.ends_with("_child") { Some(n.replace("_child", "_parent")) } else { None };
            s.ingest(n, "", b, &fp, parent.as_deref(), false).unwrap();
        }
        rec("ingest", t.elapsed().as_secs_f64());
        let od = work.join(format!("out{rep}"));
        fs::create_dir_all(&od).unwrap();
        let t = Instant::now();
        for (n, _) in &files {
            s.materialize(&Target::Name { namespace: "", name: n }, &od.join(n), None, None, false).unwrap();
        }
        rec("materialize", t.elapsed().as_secs_f64());
        for (n, b) in &files {
            assert!(fs::read(od.join(n)).unwrap() == *b, "{n} not byte-exact");
        }
        let st = s.stats().unwrap();
        if rep == 0 {
            println!("raw {raw} unique_raw {} stored {}", st.unique_raw_bytes, st.stored_bytes);
        }
        drop(s);
        fs::remove_dir_all(&cd).unwrap();
        fs::remove_dir_all(&od).unwrap();
        fs::remove_dir_all(work.join(format!("store{rep}"))).unwrap();
    }
    let mbps = |k: &str| raw as f64 / best[k] / 1e6;
    for (k, v) in &all {
        let v: Vec<String> = v.iter().map(|x| format!("{x:.0}")).collect();
        println!("{k:12} best {:7.0} MB/s  runs {}", mbps(k), v.join(" "));
    }
    let med = |a: &str, b: &str| {
        let mut r: Vec<f64> = all[a].iter().zip(&all[b]).map(|(x, y)| x / y).collect();
        r.sort_by(|x, y| x.partial_cmp(y).unwrap());
        r[r.len() / 2]
    };
    println!("median per-rep ratio: ingest/copy_fsync {:.2}  materialize/copy {:.2}", med("ingest", "copy_fsync"), med("materialize", "copy"));
    println!("ingest/copy_fsync {:.2}  materialize/copy {:.2}", mbps("ingest") / mbps("copy_fsync"), mbps("materialize") / mbps("copy"));
    std::io::stdout().flush().unwrap();
}
